"""TensorFlow training on JPEG shards, its input pipeline alone measured: hvdtrain.tf's per-sample
function of today against the one of commit 28df670 (the whole image decoded, resized to a 1.14 x
size square, a random size x size crop and flip), side by side in one run: `python -m hvdtrain.tf`
itself, 2 ranks x 1 thread, one epoch of ImageNet-sized JPEGs (500x375) at 224 px, a Keras model
too small to matter (pooled to 8x8, one dense layer).

    python benchmarks/tf_data_training.py --out /tmp/tf-data-training      # about 4 minutes on 2 cores
    python benchmarks/tf_data_training.py --images 3072 --repeats 3

Both runs are the same trainer, shards, order, ranks and threads; the "before" run swaps
hvdtrain/tf/data.py's `_image_loader` for the earlier function (data_pipeline.py's
`loader_decoding_whole_images`, as it was) and reads
each shard member by a call of its own, as it did, before the trainer starts. Each repeat runs both in turn (a noisy spell hits both); medians and their ratio
are printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)


def tiny_keras():
    """Microseconds a batch, whatever the pipeline."""
    import keras

    return keras.Sequential([keras.layers.Input((224, 224, 3)), keras.layers.AveragePooling2D(28),
                             keras.layers.Flatten(), keras.layers.Dense(10)])


def rank_main(pipeline: str, argv: list[str]) -> None:
    """One rank: the trainer, with the earlier per-sample function where asked."""
    from hvdtrain.tf import keras_compat

    keras_compat.select("custom")  # before TensorFlow is imported, as the command line does
    if pipeline == "before":
        from hvdtrain.tf import data

        from data_pipeline import loader_decoding_whole_images

        data._image_loader = loader_decoding_whole_images
        build_data = data.build_data

        def build_data_before(*args, **kwargs):  # each shard member read by a call of its own, as before
            built = build_data(*args, **kwargs)
            built.read_many = None
            return built
        data.build_data = build_data_before
    from hvdtrain.tf.cli import main

    main(argv)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/hvdtrain-tf-data-training")
    p.add_argument("--images", type=int, default=3072)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)

    from data_pipeline import jpeg_folder_and_shards

    from hvdtrain.launch import launch_command, launch_env

    _, shard_dir, kb = jpeg_folder_and_shards(args.out, args.images)
    result = os.path.join(args.out, "result.json")
    trainer = ["--model", f"{os.path.abspath(__file__)}:tiny_keras", "--dataset", "shards", "--data-dir", shard_dir,
               "--image-size", "224", "--batch-size", str(args.batch_size), "--epochs", "1", "--threads-per-rank", "1",
               "--validation", "off", "--untimed-steps", "3", "--base-lr", "0.01", "--result-json", result]
    rates: dict[str, list[float]] = {"before": [], "now": []}
    for repeat in range(args.repeats):
        for pipeline in rates:
            command = [*launch_command("mpirun", args.ranks), sys.executable, os.path.abspath(__file__), "--rank",
                       pipeline, "--", *trainer]
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=REPO,
                                  env=launch_env(PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2"))
            if done.returncode:
                raise SystemExit(f"{pipeline} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            with open(result) as f:
                rates[pipeline].append(json.load(f)["throughput"]["total_images_per_sec"])
            print(f"tf_data_training: repeat {repeat + 1}: {pipeline} {rates[pipeline][-1]:.1f} img/s", flush=True)
    median = {k: statistics.median(v) for k, v in rates.items()}
    figures = {"images": args.images, "jpeg_kb": round(kb, 1), "ranks": args.ranks, "threads_per_rank": 1,
               "img_per_s": {k: round(v, 1) for k, v in median.items()},
               "now_over_before": round(median["now"] / median["before"], 2), "runs": rates}
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], sys.argv[4:])  # --rank PIPELINE -- trainer arguments
    else:
        main()
