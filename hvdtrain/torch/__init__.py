"""hvdtrain for PyTorch: `hvdtrain.torch.fit(model, train_data, val_data, loss=..., **options)` for
your own model and data (hvdtrain/torch/api.py), `python -m hvdtrain.torch --help` for the
command line (hvdtrain/torch/train.py).

Importing this package imports nothing more (its DataLoader workers import it too): `fit` and
`loop` (your own loop, hvdtrain/torch/loop.py) are loaded when first used.
"""


def __getattr__(name):
    if name == "fit":
        from hvdtrain.torch.api import fit

        return fit
    if name == "loop":  # hvdtrain.torch.loop.start(...) after `import hvdtrain.torch`, as the README shows
        import importlib

        return importlib.import_module("hvdtrain.torch.loop")
    raise AttributeError(f"module 'hvdtrain.torch' has no attribute '{name}'")
