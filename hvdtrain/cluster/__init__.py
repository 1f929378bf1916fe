"""Where the job runs: the launcher's environment read once (`env`: ranks, hosts, the GPU each
rank takes), the sockets a rank listens on (`netsockets`), Open MPI's and Horovod's settings from
the resources (`tuning`), and Horovod's start with its checks (`horovod_ops`). It imports nothing
of the trainer, the data or a framework."""
