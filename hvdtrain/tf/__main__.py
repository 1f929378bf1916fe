"""TensorFlow trainer: `python -m hvdtrain.tf --help` (see hvdtrain/tf/cli.py and train.py)."""
from hvdtrain.tf.cli import main

main()
