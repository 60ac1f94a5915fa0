"""Training the default model (docs/training.md): `python -m tools.train.train --out OUT`."""
