"""Horovod allreduce and broadcast of torch tensors: every rank checks the values it receives."""
import horovod.torch as hvd
import torch

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert size == 2, f"rank {rank}: expected 2 ranks, got {size}"

summed = hvd.allreduce(torch.tensor([rank + 1.0, 10.0 * rank]), op=hvd.Sum, name="sum")
expected = torch.tensor([sum(r + 1.0 for r in range(size)), sum(10.0 * r for r in range(size))])
assert torch.equal(summed, expected), f"rank {rank}: allreduce sum {summed} != {expected}"

averaged = hvd.allreduce(torch.full((3,), float(rank)), op=hvd.Average, name="avg")
assert torch.allclose(averaged, torch.full((3,), (size - 1) / 2)), f"rank {rank}: average {averaged}"

value = torch.arange(4.0) + 100 if rank == 0 else torch.zeros(4)
received = hvd.broadcast(value, root_rank=0, name="bcast")
assert torch.equal(received, torch.arange(4.0) + 100), f"rank {rank}: broadcast got {received}"

gathered = hvd.allgather(torch.tensor([rank]), name="gather")
assert gathered.tolist() == list(range(size)), f"rank {rank}: allgather {gathered}"
print(f"COLLECTIVES-OK torch rank {rank}/{size} sum={summed.tolist()}", flush=True)
hvd.shutdown()
