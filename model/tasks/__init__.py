"""Task data the trained models are trained and evaluated on: numpy only, seeded, with
held-out splits.  ``train/`` (the optional training extra) trains on them; ``moekda demo``
and the benches evaluate the chip on them without the training extra.

* ``mqar``: multi-query associative recall (model/tasks/mqar.py), scored at the queries;
* ``chars``: character-level language modelling on the Python standard library's sources
  (model/tasks/chars.py), scored at every byte.
"""
from __future__ import annotations

TASKS = ("mqar", "chars")


def splits(task: str, settings: dict, model_vocab: int, n_train: int, n_heldout: int):
    """(vocab, training split of n_train examples, held-out split of n_heldout) of a run's task
    from its settings (``train.loop.RunSettings`` as a dict: seq_len, seed; pairs and vocab for
    MQAR).  The same examples for training, the quantiser's calibration and the demo."""
    if task == "chars":
        from model.tasks import chars
        if model_vocab != chars.VOCAB:
            raise ValueError(f"task chars: a byte vocabulary of {chars.VOCAB}; the model has {model_vocab}")
        return (chars.VOCAB, chars.split("train", n_train, settings["seq_len"], settings["seed"]),
                chars.split("heldout", n_heldout, settings["seq_len"]))
    if task == "mqar":
        from model.tasks import mqar
        vocab = settings.get("vocab") or model_vocab
        args = (vocab, settings["pairs"], settings["seq_len"], settings["seed"])
        return vocab, mqar.split("train", n_train, *args), mqar.split("heldout", n_heldout, *args)
    raise ValueError(f"task {task!r}: allowed are {', '.join(TASKS)}")
