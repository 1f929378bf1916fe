"""Published scaling figures, reproduced by the model from their published inputs: the check
that the model's arithmetic holds where someone measured (docs/scaling.md prints the table:
`python -m hvdtrain.predict --anchors`).

Horovod's benchmark (its documentation, "Benchmarks"): tf_cnn_benchmarks, synthetic data, batch
64 a GPU, servers of 4 Pascal GPUs on a RoCE-capable 25 Gbit/s network: at 512 GPUs (128
servers) 90 % for Inception V3 and ResNet-101, 68 % for VGG-16; an earlier run at 128 GPUs (32
servers) 90 %, 90 % and 79 %. Inputs: one P100's images/sec from TensorFlow's benchmark page
(DGX-1, batch 64, synthetic: Inception V3 142, VGG16 154; ResNet-101 is not listed: 129,
interpolated between ResNet-50's 219 and ResNet-152's 91.8 by the FLOPs of He et al.'s Table
1, 3.8 / 7.6 / 11.3 G); parameters from Keras Applications' table; the network at 90 % of 25
Gbit/s; within a server PCIe (the GPUs' form factor is not published: an assumption); Horovod's
64 MiB fusion buffers and a 5 ms cycle (assumed), one flat ring (its default then)."""
from __future__ import annotations

from dataclasses import dataclass

from hvdtrain.predict.model import Cluster, Exchange, Workload, step

UBER_2017 = Cluster("horovod-benchmark-servers", gpus_per_node=4, cores_per_gpu=0, intra_busbw_gbs=10.0,
                    inter_busbw_gbs=0.9 * 25 / 8,
                    sources=("Horovod documentation, Benchmarks: 4 Pascal GPUs a server, RoCE-capable 25 Gbit/s",))

# Horovod as it was benchmarked: 64 MiB fusion buffers, a 5 ms cycle (an assumption: its cycle's default then).
HOROVOD_2017 = Exchange("horovod", 64 * 2**20, cycle_s=0.005)

P100_IMAGES_PER_S = {"inception_v3": 142.0, "resnet101": 129.0, "vgg16": 154.0}
PARAMETERS = {"inception_v3": 23_851_784, "resnet101": 44_707_176, "vgg16": 138_357_544}


@dataclass(frozen=True)
class Anchor:
    model: str
    gpus: int
    published: float
    predicted: float

    @property
    def distance_points(self) -> float:
        return 100 * (self.predicted - self.published)


PUBLISHED = (("inception_v3", 512, 0.90), ("resnet101", 512, 0.90), ("vgg16", 512, 0.68),
             ("inception_v3", 128, 0.90), ("resnet101", 128, 0.90), ("vgg16", 128, 0.79))


def horovod_benchmark() -> list[Anchor]:
    anchors = []
    for model, gpus, published in PUBLISHED:
        work = Workload(batch=64, compute_s=64 / P100_IMAGES_PER_S[model], optimizer_s=0.0,
                        gradient_bytes=4 * PARAMETERS[model])
        anchors.append(Anchor(model, gpus, published, step(work, gpus, UBER_2017, HOROVOD_2017).efficiency))
    return anchors
