"""Horovod data-parallel training on TensorFlow 2.21: `python -m hvdtrain.tf` (Keras `fit` or a
GradientTape loop). Importing this package imports no framework; TensorFlow is loaded by
hvdtrain.tf.train once hvdtrain.tf.keras_compat has chosen the Keras version.

    mpirun -np 2 python -m hvdtrain.tf --model mnist_cnn --dataset digits --loop custom --epochs 8
"""
