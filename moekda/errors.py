"""Errors a user can fix (bad input, missing tool): printed by the `moekda` command as one
line, exit code 2.  Here, not in cli/__init__.py, so that flow/ and sim/ can raise them
without importing the command-line layer."""


class UserError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""
