"""Training defaults per model, in the spirit of torchvision's reference recipes: the optimizer, LR,
schedule, warm-up and weight decay a model trains well with. An option given on the command line
always wins over its recipe; the log's `recipe:` line says which recipe was used and what was
overridden.

Why per model: ImageNet's recipe (SGD, momentum 0.9, LR 0.1 per 256 images = 0.0125 per 32) left
the small digits CNN at 82.6 % after 8 epochs on 2 ranks; Adam at 0.005 per rank reaches about 98 %.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Recipe:
    name: str
    optimizer: str
    base_lr: float            # for one rank and one batch per allreduce; scaled as TrainConfig.lr says
    lr_schedule: str
    warmup_epochs: float
    momentum: float           # SGD only
    weight_decay: float

    def options(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "name"}


# ResNets on ImageNet-shaped data: torchvision's classification reference (SGD, momentum 0.9,
# LR 0.1 for a global batch of 256, i.e. 0.0125 for one rank's 32), cosine decay.
IMAGENET = Recipe("imagenet", optimizer="sgd", base_lr=0.0125, lr_schedule="cosine", warmup_epochs=0.0,
                  momentum=0.9, weight_decay=5e-5)
# Small CNNs on MNIST-like data: Adam with cosine decay, no weight decay (8 epochs of digits on 2
# ranks: 98.0 % torch, about 98 % TF).
SMALL_CNN = Recipe("small-cnn", optimizer="adam", base_lr=0.005, lr_schedule="cosine", warmup_epochs=0.0,
                   momentum=0.9, weight_decay=0.0)

# A user's own model (--model FILE.py:FUNCTION, hvdtrain.torch.fit): nothing is known of it, so
# what most training scripts start from: AdamW at 1e-3 per rank, constant, no weight decay.
YOUR_MODEL = Recipe("your-model", optimizer="adamw", base_lr=0.001, lr_schedule="constant", warmup_epochs=0.0,
                    momentum=0.9, weight_decay=0.0)

MODEL_RECIPES = {"resnet50": IMAGENET, "resnet18": IMAGENET, "mnist_cnn": SMALL_CNN}
OPTIONS = tuple(IMAGENET.options())  # the TrainConfig fields a recipe sets


def for_model(model: str) -> Recipe:
    # A reference (module:function) is the user's model; an unknown name is reported by the
    # trainer's model check, and its recipe does not matter.
    return MODEL_RECIPES.get(model, YOUR_MODEL if ":" in model else IMAGENET)


def describe(cfg) -> str:
    """The log's recipe line: which recipe, the values in force, and which the command line chose."""
    values = ", ".join(f"{k} {getattr(cfg, k):g}" if isinstance(getattr(cfg, k), float) else f"{k} {getattr(cfg, k)}"
                       for k in OPTIONS)
    given = f"; given on the command line: {', '.join(cfg.recipe_overrides)}" if cfg.recipe_overrides else ""
    return f"{cfg.recipe} for {cfg.model} ({values}){given}"
