"""Training of the project's float model (issue 16): an optional extra on JAX (CPU).

``train.model`` is the float model (model/float_layer.py, float_model.py) in JAX over
whole sequences, with its parameters as a pytree converted exactly to and from
``model.params``; the task data (multi-query associative recall) are ``model.tasks``, numpy only;
``train.loop`` a short training run (``python -m train``).  Nothing in hw/, flow/ or sim/
imports this package: the chip and its models never need JAX.
"""
