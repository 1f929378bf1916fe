"""ImageNet as the JSC course reads it: its own `Dataset` class over a pickled index of
(relative path, label) pairs under a data root, trained with hvdtrain's built-in ResNet-50.

The data root holds the images (any layout) and two index files, each a pickled dict
{relative path: label} or a list of (relative path, label) pairs, labels 0..K-1:

    $DATA_ROOT/train_index.pkl   $DATA_ROOT/val_index.pkl   $DATA_ROOT/<relative paths>

On a Slurm cluster (one task per GPU), or with mpirun:

    export DATA_ROOT=/p/scratch/.../imagenet IMAGE_SIZE=224
    srun --mpi=pmix --ntasks-per-node=4 --gpus-per-task=1 python -m hvdtrain.torch --model resnet50 \\
        --dataset torch_examples/jsc_imagenet_dataset.py:datasets --epochs 90 --num-workers 8
    mpirun -np 2 python -m hvdtrain.torch --model resnet50 \\
        --dataset torch_examples/jsc_imagenet_dataset.py:datasets --epochs 1

Check an index before a job spends its allocation on it:

    DATA_ROOT=... python torch_examples/jsc_imagenet_dataset.py

hvdtrain reads the number of classes from the training set's `classes` (a built-in model needs
it); nothing here knows about ranks: hvdtrain shards the data and starts the loader workers.

Images are decoded to uint8 tensors and augmented as uint8 (hvdtrain/torch/images.py: about twice
PIL + ToTensor per core); `input_normalization` tells hvdtrain to make them normalised floats on the
GPU, after the copy. The same index can be written as tar shards, which read faster on a parallel
file system and fit an inode quota:

    python -m hvdtrain.shards write --index train=$DATA_ROOT/train_index.pkl \
        --index val=$DATA_ROOT/val_index.pkl --root $DATA_ROOT --out $SCRATCH/imagenet-shards
    srun python -m hvdtrain.torch --model resnet50 --dataset shards --data-dir $SCRATCH/imagenet-shards
"""
import operator
import os
import pickle

from torch.utils.data import Dataset

from hvdtrain.torch import images


class ImageNetIndex(Dataset):
    """(uint8 image tensor, label) for each (relative path, label) of a pickled index under `root`."""

    input_normalization = images.IMAGENET_NORMALIZATION  # (mean, std): applied on the device

    def __init__(self, root: str, index_file: str, transform, num_classes: int | None = None):
        where = os.path.join(root, index_file)
        with open(where, "rb") as f:
            index = pickle.load(f)
        pairs = sorted(index.items()) if isinstance(index, dict) else list(index)
        try:
            self.samples = [(path, operator.index(label)) for path, label in pairs]  # numpy ints too
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected (relative path, integer label) pairs") from None
        # Class indices, as many as the model's outputs: the largest label + 1; the validation
        # set takes the training set's count, whichever labels it holds.
        labels = [label for _, label in self.samples]
        self.classes = list(range(num_classes or max(labels, default=-1) + 1))
        if labels and not 0 <= min(labels) <= max(labels) < len(self.classes):
            raise ValueError(f"{where}: labels {min(labels)}..{max(labels)}, expected 0..{len(self.classes) - 1}")
        self.root, self.transform = root, transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        return self.transform(images.load_file(os.path.join(self.root, path))), label


def datasets():
    """(train, val) from $DATA_ROOT's train_index.pkl and val_index.pkl, at $IMAGE_SIZE (224)."""
    root = os.environ.get("DATA_ROOT")
    if not root:
        raise RuntimeError("set DATA_ROOT to the folder holding train_index.pkl and val_index.pkl")
    size = int(os.environ.get("IMAGE_SIZE", "224"))
    # RandomResizedCrop + flip; resize to size x 256/224 and centre crop (torchvision's v2, on uint8).
    train = ImageNetIndex(root, "train_index.pkl", images.train_augment(size))
    val = ImageNetIndex(root, "val_index.pkl", images.val_augment(size), len(train.classes))
    return train, val


if __name__ == "__main__":
    train, val = datasets()
    x, _ = train[0]
    print(f"train: {len(train)} images, {len(train.classes)} classes; val: {len(val)} images; "
          f"an input is {tuple(x.shape)}")
