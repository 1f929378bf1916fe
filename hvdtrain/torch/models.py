"""Models by name. No parallelism here: backends wrap the model afterwards."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F
# Imported here, not lazily: torchvision's import loads torch._dynamo and with it triton, whose
# library crashes the process (SIGSEGV) when it is loaded after TensorFlow's (torch 2.14, TF 2.21:
# `python -c "import tensorflow; import torch._dynamo"`). Loaded first, both work; and a torch
# optimizer loads torch._dynamo anyway.
import torchvision

from hvdtrain.errors import UsageError


class MnistCNN(nn.Module):
    """The small CNN of PyTorch's MNIST example (the IDRIS/JSC course material's baseline), sized for any input side."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        side = (image_size - 4) // 2
        self.fc1 = nn.Linear(64 * side * side, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return self.fc2(x)


def _resnet(builder):
    def build(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
        model = builder(weights=None, num_classes=num_classes)  # random init: no downloads
        if in_channels != 3:
            model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        return model
    return build


MODELS = {
    "resnet50": _resnet(torchvision.models.resnet50),
    "resnet18": _resnet(torchvision.models.resnet18),
    "mnist_cnn": lambda in_channels, num_classes, image_size: MnistCNN(in_channels, num_classes, image_size),
}
CHANNELS_LAST_MODELS = ("resnet50", "resnet18")


def check_model_name(name: str) -> None:
    if name not in MODELS:
        raise UsageError(f"unknown model '{name}'; valid: {', '.join(MODELS)}")


def build_model(name: str, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    check_model_name(name)
    if name == "mnist_cnn" and image_size < 6:
        raise UsageError(f"mnist_cnn needs images of at least 6x6 (got {image_size})")
    return MODELS[name](in_channels, num_classes, image_size)
