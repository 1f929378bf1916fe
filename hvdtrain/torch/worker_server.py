"""The forkserver's preload (hvdtrain/torch/workers.py): importing this module prepares the
process that forks DataLoader workers. Only the forkserver imports it."""
from hvdtrain.torch.workers import serve_from_here

serve_from_here()
