"""Task data the trained models are trained and evaluated on: numpy only, seeded, with
held-out splits.  ``train/`` (the optional training extra) trains on them; ``moekda demo``
and the benches evaluate the chip on them without the training extra."""
