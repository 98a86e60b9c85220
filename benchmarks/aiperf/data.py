"""ImageNet in its standard layout, root/{train,val}/<class>/<image>.JPEG: one validation that trusts
nothing on disk, and the torch loaders AIPerf's trials train and evaluate with."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from torchvision import transforms

from mlhpc.common.errors import DataError
from mlhpc.common.printable import shown
from mlhpc.common.safeio.datasets import existing_data_dir, not_a_file, open_sample
from mlhpc.common.safeio.safepath import inside
from mlhpc.common.training.loaders import OneLineLoader

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
"""Image file endings accepted, compared lower-cased (ImageNet's own are .JPEG)."""
DECODED_FORMATS = ("JPEG", "PNG")
"""What PIL may decode, whatever a file's ending says (ImageNet holds a PNG and CMYK JPEGs named
.JPEG): never its other plugins, one of which runs Ghostscript on an EPS file."""
MAX_NAME_BYTES = 255
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
"""ImageNet's per-channel mean and standard deviation, on the 0-1 scale."""
CROP_FROM = 64
"""From this image size up, random-resized crops for training and resize-then-centre-crop for
validation; below it (the synthetic minis) whole images, resized."""
_LAYOUT = "ImageNet's layout is root/train/<class>/<image>.JPEG and root/val/<class>/<image>.JPEG"


@dataclass(frozen=True)
class ImageNetIndex:
    """A validated ImageNet folder: its classes and every image with its label."""

    root: Path
    classes: tuple[str, ...]
    """Class folder names, sorted; a label is an index into this."""
    train: tuple[tuple[str, int], ...]
    """(path, label) of every training image, by class then file name."""
    val: tuple[tuple[str, int], ...]
    """(path, label) of every validation image, by class then file name."""


def _name_problem(name: str) -> str | None:
    """What makes a folder entry's name unsafe, or None."""
    if name.startswith("."):
        return "starts with '.'"
    if any(c in name for c in "/\\\0") or not name.isprintable():
        return "holds a path separator or a control character"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if len(encoded) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    return None


def _refuse(path: str | Path, problem: str, fix: str) -> DataError:
    return DataError(f"{shown(path)} {problem}; {fix}")


def _entries(folder: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError as e:
        raise _refuse(folder, f"cannot be listed ({e.strerror or e})", "check the data folder") from e
    for entry in entries:
        problem = _name_problem(entry.name)
        if problem is not None:
            raise _refuse(entry.path, f"has a name that {problem}", "rename or remove it")
    return entries


def _real_folder(path: str, real_root: str, what: str) -> None:
    """A DataError unless `path` is a folder that (links followed) stays inside the root."""
    if not os.path.isdir(path):
        raise _refuse(path, f"is not a folder ({what})", f"{_LAYOUT}")
    if not inside(path, real_root):
        raise _refuse(path, "is a link leading out of the data folder", "copy the data into it instead")


def _images(class_dir: str, real_root: str) -> list[str]:
    """The images of one class folder, sorted; the folder is known to lie inside the root, so only
    a link in it can lead out."""
    found = []
    for entry in _entries(class_dir):
        if not entry.name.lower().endswith(IMAGE_SUFFIXES):
            raise _refuse(entry.path, "is not an image (.JPEG, .jpg, .jpeg or .png)", "remove it")
        try:
            if entry.is_symlink() and not inside(entry.path, real_root):
                raise _refuse(entry.path, "is a link leading out of the data folder", "copy the file instead")
            mode = stat.S_IFREG if entry.is_file() else entry.stat().st_mode
        except OSError as e:
            raise _refuse(entry.path, f"cannot be read ({e.strerror or e})", "replace or remove it") from e
        if not stat.S_ISREG(mode):
            raise not_a_file(entry.path, mode)
        found.append(entry.path)
    return found


def _class_dirs(split_dir: str, real_root: str) -> dict[str, str]:
    folders = {}
    for entry in _entries(split_dir):
        _real_folder(entry.path, real_root, "only class folders belong in train/ and val/")
        folders[entry.name] = entry.path
    return folders


def validate_imagenet(root: Path) -> ImageNetIndex:
    """Every class and image under `root` checked against ImageNet's layout, or one DataError
    naming the offending path and the fix: train/ and val/ are folders inside root, every name is
    safe, every entry a regular image file inside root, val's classes are train's (or fewer), no
    training class is empty, and there are at least two classes."""
    root = existing_data_dir(root, "aiperf")
    real_root = os.path.realpath(root)
    splits = {}
    for split in ("train", "val"):
        path = os.path.join(root, split)
        if not os.path.lexists(path):
            raise _refuse(path, "is missing", _LAYOUT)
        _real_folder(path, real_root, _LAYOUT)
        splits[split] = _class_dirs(path, real_root)
    train_dirs, val_dirs = splits["train"], splits["val"]
    extra = sorted(set(val_dirs) - set(train_dirs))
    if extra:
        raise _refuse(
            val_dirs[extra[0]], "is a class train/ does not have", "remove it or add its training images"
        )
    if len(train_dirs) < 2:
        raise _refuse(
            os.path.join(root, "train"), f"holds {len(train_dirs)} class folders", "give at least 2"
        )
    classes = tuple(sorted(train_dirs))
    label = {name: i for i, name in enumerate(classes)}
    train, val = [], []
    for name in classes:
        images = _images(train_dirs[name], real_root)
        if not images:
            raise _refuse(train_dirs[name], "holds no images", "remove the class or add its images")
        train += [(path, label[name]) for path in images]
        if name in val_dirs:
            val += [(path, label[name]) for path in _images(val_dirs[name], real_root)]
    if not val:
        raise _refuse(
            os.path.join(root, "val"), "holds no images", "sort the validation images into class folders"
        )
    return ImageNetIndex(root=root, classes=classes, train=tuple(train), val=tuple(val))


def count_images(index: ImageNetIndex) -> tuple[int, int]:
    """(training, validation) images in the whole dataset, all ranks together."""
    return len(index.train), len(index.val)


def decode_image(path: str) -> Image.Image:
    """The RGB image in the regular file `path`; a DataError naming it when it cannot be decoded."""
    try:
        with open_sample(path) as handle, Image.open(handle, formats=DECODED_FORMATS) as image:
            return image.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise DataError(
            f"{shown(path)} cannot be decoded as an image ({shown(e)}); replace or remove it"
        ) from e


class ImageList(Dataset):
    """(image tensor, label) of each (path, label), decoded and transformed when read."""

    def __init__(self, samples: tuple[tuple[str, int], ...], transform: Callable[[Image.Image], Any]) -> None:
        self.samples = samples
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[i]
        return self.transform(decode_image(path)), label


def image_transforms(image_size: int) -> tuple[Callable[[Image.Image], Any], Callable[[Image.Image], Any]]:
    """(train, val) transforms at `image_size`: random-resized crops and flips for training, a
    resize and centre crop for validation (whole images, resized, below CROP_FROM)."""
    finish = [transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
    if image_size >= CROP_FROM:
        train = [
            transforms.RandomResizedCrop(image_size, scale=(0.35, 1.0)),
            transforms.RandomHorizontalFlip(),
        ]
        val = [transforms.Resize(int(image_size * 1.14)), transforms.CenterCrop(image_size)]
    else:
        whole = transforms.Resize((image_size, image_size))
        train, val = [whole, transforms.RandomHorizontalFlip()], [whole]
    return transforms.Compose(train + finish), transforms.Compose(val + finish)


def build_loaders(
    index: ImageNetIndex,
    *,
    image_size: int,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    workers: int = 0,
    train_transform: Callable[[Image.Image], Any] | Literal["auto"] = "auto",
) -> tuple[DataLoader, DataLoader]:
    """This rank's (train, val) loaders, `batch_size` images a batch. Train: a DistributedSampler
    shuffling with `seed` (call `loader.sampler.set_epoch(epoch)` each epoch), the last partial
    batch dropped. Val: an unshuffled, unpadded shard (every world_size-th image from `rank`), so
    the ranks' correct counts sum to the whole set's; `count_images` gives the totals."""
    if len(index.train) < batch_size * world_size:
        raise DataError(
            f"{shown(index.root)}/train has {len(index.train)} images, fewer than batch_size={batch_size} x "
            f"world_size={world_size}; use a larger dataset or a smaller batch"
        )
    auto_train, val_transform = image_transforms(image_size)
    train_set = ImageList(index.train, auto_train if train_transform == "auto" else train_transform)
    val_set = ImageList(index.val, val_transform)
    sampler = DistributedSampler(
        train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    common = {"num_workers": workers, "persistent_workers": workers > 0}
    train = OneLineLoader(
        train_set,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed + rank),  # the workers' augmentation seeds
        **common,
    )
    shard = Subset(val_set, range(rank, len(val_set), world_size))
    return train, OneLineLoader(shard, batch_size=batch_size, shuffle=False, **common)
