"""Predicted scaling before an allocation is spent: `python -m hvdtrain.predict` (cli.py), the
model (model.py), cluster profiles (profiles.py, clusters/*.toml), published anchors (anchors.py)."""
