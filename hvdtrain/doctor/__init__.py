"""`python -m hvdtrain.doctor`: is this machine or allocation ready for hvdtrain (cli.py)?

- cli.py: the command line, the stages in order, the report and its verdict
- gpus.py: GPUs per node against ranks, each rank's GPU
- collectives.py: allreduce, broadcast and allgather through Horovod, checked and timed; the same
  allreduce through MPI directly
- health.py: each rank's compute (and GPU copy) figure, and the slow ranks named
"""
