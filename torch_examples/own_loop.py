"""Your own PyTorch training loop on N ranks: a single-process loop plus the lines marked
`# hvdtrain:` (hvdtrain/torch/loop.py: Horovod underneath). Real 8x8 digits, no download.

    python torch_examples/own_loop.py --checkpoint-dir /tmp/own              # 1 process
    mpirun -np 2 python torch_examples/own_loop.py --checkpoint-dir /tmp/own
    srun --mpi=pmix -n 2 python torch_examples/own_loop.py --checkpoint-dir /tmp/own

It checkpoints after each epoch and, run again, resumes from the newest checkpoint. SIGUSR1 or
SIGTERM (Slurm's time-limit warning, scancel) stops every rank at the same batch with a checkpoint
of where it was (Slurm's SIGUSR1 also requeues the job); the next run goes on from that batch.
Prints `epoch N: train loss L`, then `final val accuracy: A over 397 samples` (>= 0.9 after the 8
epochs) and each rank's `weights checksum`. Needs hvdtrain importable (bash scripts/setup.sh, or PYTHONPATH=.).
"""
import argparse

import torch
import torch.nn.functional as F

import hvdtrain.torch.loop
from hvdtrain.data.datasets import digits_split
from hvdtrain.result_file import checksum_arrays
from hvdtrain.torch.data import ArrayDataset
from hvdtrain.torch.models import MnistCNN

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.003, help="for one rank: multiplied by the ranks")
parser.add_argument("--checkpoint-dir", default="own_loop_checkpoints")
parser.add_argument("--checkpoint-every", help="also checkpoint mid-epoch: every N steps, or 30m, 90s, 2h")
args = parser.parse_args()

run = hvdtrain.torch.loop.start(seed=0, checkpoint_every=args.checkpoint_every)  # hvdtrain: hvd.init(), device, ...
digits = digits_split()
train, val = ArrayDataset(digits.x_train, digits.y_train), ArrayDataset(digits.x_val, digits.y_val)
model = MnistCNN(in_channels=1, num_classes=10, image_size=8)
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
model, optimizer = run.prepare(model, optimizer)             # hvdtrain: to the device, LR x ranks, rank 0's weights
start_epoch = run.resume(args.checkpoint_dir, model, optimizer)  # hvdtrain: the newest checkpoint, else 0

for epoch in range(start_epoch, args.epochs):
    model.train()
    totals = torch.zeros(2, device=run.device)               # loss sum, samples
    for x, y in run.loader(train, args.batch_size, epoch):   # hvdtrain: this rank's shard of the epoch
        x, y = x.to(run.device), y.to(run.device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        totals += torch.stack([loss.detach() * len(y), totals.new_tensor(len(y))])
        run.step_done()                                      # hvdtrain: the watchdog hears of progress
        if run.should_stop():                                # hvdtrain: a stop signal on any rank (and the
            break                                            # interval checkpoint, when one is due)
    run.save(args.checkpoint_dir, model, optimizer)          # hvdtrain: rank 0 writes where the loop is
    if run.stopped_by:                                       # hvdtrain
        break
    loss_sum, count = run.sum(totals)                        # hvdtrain: over all ranks
    run.log(f"epoch {epoch + 1}: train loss {loss_sum / count:.4f}")  # hvdtrain: rank 0 prints

if not run.stopped_by:                                       # hvdtrain: after a stop signal, no time to lose
    model.eval()
    correct = torch.zeros(2, device=run.device)              # right answers, samples
    with torch.no_grad():
        for x, y in run.eval_loader(val, 128):               # hvdtrain: each sample on one rank
            x, y = x.to(run.device), y.to(run.device)
            correct += torch.stack([(model(x).argmax(1) == y).sum().float(), correct.new_tensor(len(y))])
    right, count = run.sum(correct)                          # hvdtrain: over all ranks
    run.log(f"final val accuracy: {right / count:.4f} over {int(count)} samples")
    checksum = checksum_arrays(t.detach().cpu().numpy() for t in model.state_dict().values())
    run.log(f"rank {run.rank}: weights checksum {checksum}", every_rank=True)  # hvdtrain: equal on all ranks
run.finish()                                                 # hvdtrain: requeue after SIGUSR1, shut down
