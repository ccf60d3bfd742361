"""The one error a flow step raises when a tool fails or an input is missing.

It is a ``UserError`` so the CLI prints it as one line (exit 2): the line
names the step and the log to read, never a Python traceback.
"""
from moekda.errors import UserError


class FlowError(UserError):
    """A flow step failed; the message names the log with the details."""
