"""hvdtrain: Horovod data-parallel training for PyTorch and TensorFlow on SLURM clusters.

    srun python -m hvdtrain.torch --model resnet50 --dataset synthetic
    mpirun -np 2 python -m hvdtrain.tf --model mnist_cnn --dataset digits

Importing this package imports no framework: torch, TensorFlow and Horovod are loaded lazily
by the module that needs them, so `import hvdtrain` works where only one is installed.
"""

__version__ = "0.1.0"
