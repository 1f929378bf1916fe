"""The input pipeline's framework-free part: the samples and their splits (`datasets`), hvdtrain's
shard format, its writer and reader (`shards`), the open-file budget of a process's readers
(`open_files`), reads overlapped on a pool of threads (`parallel_reads`), the one augmentation
rule (`augment`) and DALI's graph of it (`dali_graph`). Each framework's loaders build on it:
hvdtrain/torch/data.py and loader.py, hvdtrain/tf/data.py. It imports nothing of the trainer."""
