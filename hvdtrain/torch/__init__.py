"""PyTorch trainer: `python -m hvdtrain.torch --help` (see hvdtrain/torch/train.py)."""
