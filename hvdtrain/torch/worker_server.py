"""The forkserver's preload (hvdtrain/torch/workers.py): importing this module prepares the
process that forks DataLoader workers. Only the forkserver imports it.

It imports the data code, which imports workers.py: so this lives apart from workers.py, and
no import cycle is made.
"""
import os

from hvdtrain.torch import workers


def serve_from_here() -> None:
    """Runs once, in the forkserver, when it imports its preload: die with the rank, and import
    what every worker needs, so that workers fork with it already loaded."""
    workers.die_with_parent()
    workers.SERVER_PID = os.getpid()  # read by workers.init_worker in every worker forked
    import hvdtrain.torch.data  # noqa: F401  torch and the datasets' classes
    try:
        import torchvision.datasets  # noqa: F401  image folders unpickle into these
        import torchvision.transforms  # noqa: F401
    except ImportError:
        pass


serve_from_here()
