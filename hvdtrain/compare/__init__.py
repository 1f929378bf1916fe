"""The comparison: one workload under Horovod, DDP, Accelerate, Lightning and tf.distribute,
side by side, and the scaling study over node counts (one Slurm job per size).

    python -m hvdtrain.compare --workload digits-cnn --np 1,2 --out runs/compare
    python -m hvdtrain.compare --nodes 1,2,4 --workload resnet50-synthetic --out $SCRATCH/study

- cli.py: the command line, the local runs (`--np`) and their parity checks
- workloads.py: what every backend runs (the built-in workloads, a user's model and data)
- study.py: the Slurm scaling study (`--nodes`): its job scripts, submission, collection
- report.py: the figures, parity and the Markdown/JSON/PNG report, from the result files alone
"""
