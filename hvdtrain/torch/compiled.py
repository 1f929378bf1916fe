"""torch.compile with Horovod's overlap kept.

Horovod starts a gradient's allreduce from a hook on its parameter, when autograd has computed
it. Compiled whole, a model's backward is one compiled function: every gradient appears when it
ends, so every allreduce starts after the whole backward and none overlaps it (PyTorch's
compiler FAQ; DDP avoids it with its DDPOptimizer, which splits the graph at its buckets; nothing
does it for Horovod). Compiled by regions, each region's backward is its own function: the
gradients of the last region are ready, and their allreduces running, while the regions before
it still compute theirs.

    compile_model(model, "regions")   # each top-level child (a ResNet's stem parts and stages)
    compile_model(model, "regions", regions=["encoder", "decoder"])  # the regions you name
    compile_model(model, "model")     # the whole model: DDP's compiled path; no overlap under Horovod

Each region is compiled in place (nn.Module.compile): the model's state dict keys are unchanged
(no "_orig_mod."), so checkpoints of compiled and eager runs resume each other."""
from __future__ import annotations

from hvdtrain.errors import UsageError

MODES = ("off", "model", "regions")


def compile_model(model, mode: str, backend: str = "inductor", regions=None) -> list[str]:
    """Compile `model` in place as `mode` says; the names of what was compiled ("" for the whole model)."""
    if mode == "off":
        return []
    if mode not in MODES:
        raise UsageError(f"--compile {mode}: choose one of {', '.join(MODES)}")
    if mode == "model":
        model.compile(backend=backend)
        return [""]
    names = list(regions) if regions else [name for name, _ in model.named_children()]
    if not names:  # a model without children is one region
        model.compile(backend=backend)
        return [""]
    for name in names:
        try:
            region = model.get_submodule(name)
        except AttributeError:
            raise UsageError(f"--compile regions: the model has no submodule {name!r} (its children: "
                             f"{', '.join(n for n, _ in model.named_children()) or 'none'})") from None
        region.compile(backend=backend)
    return names


def describe(mode: str, backend: str, names: list[str], exchange: str) -> str:
    """The start's line: what was compiled, and what it means for the gradient exchange."""
    if mode == "off":
        return "compile: off (eager)"
    if names == [""]:
        overlap = ("Horovod's allreduces start after the whole backward (no overlap; --compile regions keeps it)"
                   if exchange == "horovod" else "DDP's compiled path (its DDPOptimizer splits the graph at its "
                   "buckets)" if exchange == "ddp" else "")
        return f"compile: the whole model ({backend}){'; ' + overlap if overlap else ''}"
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    return (f"compile: {len(names)} region(s) ({backend}): {shown}; each region's gradients are exchanged while "
            "the regions before it compute theirs")
