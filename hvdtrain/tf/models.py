"""Keras models by name, built with the Keras package the loop runs on (Keras 3 or tf_keras).
No parallelism here: the backend wraps the optimizer or the tape afterwards. Models output
logits; images are channels-last (N, H, W, C).

    model = build_model(keras, "mnist_cnn", in_channels=1, num_classes=10, image_size=8)

Importing this module imports no framework, so the CLI can check model names first.
"""
from __future__ import annotations

from hvdtrain.errors import UsageError


def mnist_cnn(keras, in_channels: int, num_classes: int, image_size: int):
    """The small CNN of PyTorch's MNIST example, layer for layer as hvdtrain.torch.models.MnistCNN."""
    if image_size < 6:
        raise UsageError(f"mnist_cnn needs images of at least 6x6 (got {image_size})")
    L = keras.layers
    return keras.Sequential([
        keras.Input((image_size, image_size, in_channels)),
        L.Conv2D(32, 3, activation="relu"),
        L.Conv2D(64, 3, activation="relu"),
        L.MaxPooling2D(2),
        L.Dropout(0.25),
        L.Flatten(),
        L.Dense(128, activation="relu"),
        L.Dropout(0.5),
        L.Dense(num_classes),
    ], name="mnist_cnn")


def resnet50(keras, in_channels: int, num_classes: int, image_size: int):
    if image_size < 32:
        raise UsageError(f"resnet50 needs images of at least 32x32 (got {image_size})")
    # weights=None: random init, nothing is downloaded.
    return keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, in_channels),
                                       classes=num_classes, classifier_activation=None)


def resnet18(keras, in_channels: int, num_classes: int, image_size: int):
    """torchvision's resnet18 layer for layer (Keras ships no ResNet-18): the comparison's
    throughput workload runs on both frameworks. BatchNorm as torch's (eps 1e-5, momentum 0.1)."""
    if image_size < 32:
        raise UsageError(f"resnet18 needs images of at least 32x32 (got {image_size})")
    L = keras.layers

    def conv_bn(x, filters, kernel, stride, relu=True):
        if kernel > 1:
            x = L.ZeroPadding2D(kernel // 2)(x)  # torch's symmetric padding, not TF's "same"
        x = L.Conv2D(filters, kernel, stride, use_bias=False)(x)
        x = L.BatchNormalization(epsilon=1e-5, momentum=0.9)(x)
        return L.ReLU()(x) if relu else x

    def basic_block(x, filters, stride):
        shortcut = x
        if stride != 1 or x.shape[-1] != filters:
            shortcut = conv_bn(x, filters, 1, stride, relu=False)
        y = conv_bn(conv_bn(x, filters, 3, stride), filters, 3, 1, relu=False)
        return L.ReLU()(L.Add()([y, shortcut]))

    inputs = keras.Input((image_size, image_size, in_channels))
    x = conv_bn(inputs, 64, 7, 2)
    x = L.MaxPooling2D(3, 2)(L.ZeroPadding2D(1)(x))
    for stage, filters in enumerate((64, 128, 256, 512)):
        x = basic_block(x, filters, 1 if stage == 0 else 2)
        x = basic_block(x, filters, 1)
    outputs = L.Dense(num_classes)(L.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, outputs, name="resnet18")


MODELS = {"resnet50": resnet50, "resnet18": resnet18, "mnist_cnn": mnist_cnn}


def check_model_name(name: str) -> None:
    if name not in MODELS:
        raise UsageError(f"unknown model '{name}'; valid: {', '.join(MODELS)}")


def build_model(keras, name: str, in_channels: int, num_classes: int, image_size: int):
    check_model_name(name)
    return MODELS[name](keras, in_channels, num_classes, image_size)
