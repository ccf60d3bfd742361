"""The studies on top of the chip, the models and the flow: bench, sweep, context, table cost."""
