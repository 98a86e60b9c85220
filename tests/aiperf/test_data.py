"""AIPerf's ImageNet: the synthetic generator (layout, determinism, reuse, refusals), the layout
validation against hostile folders, the loaders' shapes and shards, and that the data is learnable."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

from mlhpc.benchmarks.aiperf import synthetic
from mlhpc.benchmarks.aiperf.data import build_loaders, count_images, validate_imagenet
from mlhpc.benchmarks.aiperf.synthetic import MARKER, generate_imagenet
from mlhpc.common.errors import DataError

TINY = {"classes": 4, "train_per_class": 6, "val_per_class": 2, "resolution": 32}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic ImageNet: 4 classes x (6 train + 2 val) at 32 px; never modified."""
    return generate_imagenet(tmp_path_factory.mktemp("tiny") / "imagenet", **TINY)


@pytest.fixture
def copy(tiny: Path, tmp_path: Path) -> Path:
    """A copy of the tiny dataset this test may spoil."""
    return Path(shutil.copytree(tiny, tmp_path / "copy", symlinks=True))


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def one_line_error(call: Callable[[], object]) -> str:
    with pytest.raises(DataError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------- the generator
def test_the_generator_writes_imagenets_layout_and_it_validates(tiny: Path) -> None:
    index = validate_imagenet(tiny)
    assert len(index.classes) == 4 and list(index.classes) == sorted(index.classes)
    assert all(len(name) == 9 and name[0] == "n" and name[1:].isdigit() for name in index.classes)
    assert count_images(index) == (24, 8)
    assert [label for _, label in index.train] == [c for c in range(4) for _ in range(6)]
    for path, label in index.train[:3] + index.val[-3:]:
        assert Path(path).parent.name == index.classes[label] and path.endswith(".JPEG")
        with Image.open(path) as image:
            assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (32, 32))
    assert sorted(p.name for p in tiny.parent.iterdir()) == ["imagenet"]  # no work folder left


def test_the_same_seed_gives_the_same_bytes_and_another_seed_others(tiny: Path, tmp_path: Path) -> None:
    again = generate_imagenet(tmp_path / "again", **TINY)
    assert files(again) == files(tiny)
    other = files(generate_imagenet(tmp_path / "other", **TINY, seed=1))
    assert other.keys() != files(tiny).keys()  # other class names
    assert set(other.values()).isdisjoint(files(tiny).values())


def test_a_rerun_with_the_same_parameters_reuses_the_dataset(copy: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in copy.rglob("*")}
    assert generate_imagenet(copy, **TINY) == copy
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*")} == before


def test_other_parameters_or_a_foreign_folder_are_refused_untouched(copy: Path, tmp_path: Path) -> None:
    message = one_line_error(lambda: generate_imagenet(copy, **{**TINY, "classes": 5}))
    assert str(copy) in message and "other parameters" in message and "classes=4" in message
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    message = one_line_error(lambda: generate_imagenet(foreign, **TINY))
    assert str(foreign) in message and "not an mlhpc synthetic ImageNet" in message
    assert [p.name for p in foreign.iterdir()] == ["thesis.tex"]
    (copy / MARKER).write_text("{not json")  # a marker that proves nothing
    assert "not an mlhpc synthetic ImageNet" in one_line_error(lambda: generate_imagenet(copy, **TINY))


def test_an_empty_folder_is_generated_into(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    generate_imagenet(tmp_path / "empty", **TINY)
    assert count_images(validate_imagenet(tmp_path / "empty")) == (24, 8)


def test_a_failed_generation_leaves_nothing_under_the_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn = []

    def draw_then_die(self: object, rng: object, size: int) -> object:
        drawn.append(size)
        if len(drawn) == 10:
            raise KeyboardInterrupt  # a kill halfway
        return original(self, rng, size)

    original = synthetic._ClassLook.draw
    monkeypatch.setattr(synthetic._ClassLook, "draw", draw_then_die)
    with pytest.raises(KeyboardInterrupt):
        generate_imagenet(tmp_path / "half", **TINY)
    assert list(tmp_path.iterdir()) == []


def test_a_dataset_too_large_for_the_disk_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    huge = {"classes": 1000, "train_per_class": 10**6, "val_per_class": 50, "resolution": 224}
    message = one_line_error(lambda: generate_imagenet(tmp_path / "huge", **huge))
    assert str(tmp_path / "huge") in message and ("free space" in message or "--allow-size" in message)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- hostile layouts
def _link_out_file(root: Path) -> Path:
    secret = root.parent / "secret.JPEG"
    secret.write_bytes(b"outside")
    link = next((root / "train").iterdir()) / "zz.JPEG"
    link.symlink_to(secret)
    return link


def _link_out_class(root: Path) -> Path:
    outside = root.parent / "elsewhere"
    shutil.copytree(next((root / "train").iterdir()), outside)
    (root / "train" / "n99999999").symlink_to(outside)
    return root / "train" / "n99999999"


def _backslash_name(root: Path) -> Path:
    path = next((root / "train").iterdir()) / "..\\x.JPEG"  # '/' cannot be in a name; '\' can
    path.write_bytes(b"")
    return path


def _hidden_name(root: Path) -> Path:
    path = next((root / "val").iterdir()) / ".x.JPEG"
    path.write_bytes(b"")
    return path


def _empty_class(root: Path) -> Path:
    (root / "train" / "n00000001").mkdir()
    return root / "train" / "n00000001"


def _class_only_in_val(root: Path) -> Path:
    (root / "val" / "n00000002").mkdir()
    return root / "val" / "n00000002"


def _not_an_image(root: Path) -> Path:
    path = next((root / "train").iterdir()) / "notes.txt"
    path.write_text("hello")
    return path


def _fifo(root: Path) -> Path:
    path = next((root / "val").iterdir()) / "pipe.JPEG"
    os.mkfifo(path)
    return path


def _no_val(root: Path) -> Path:
    shutil.rmtree(root / "val")
    return root / "val"


def _train_links_out(root: Path) -> Path:
    shutil.move(root / "train", root.parent / "train-elsewhere")
    (root / "train").symlink_to(root.parent / "train-elsewhere")
    return root / "train"


def _one_class(root: Path) -> Path:
    for folder in sorted((root / "train").iterdir())[1:]:
        shutil.rmtree(folder)
        shutil.rmtree(root / "val" / folder.name)
    return root / "train"


def _file_among_classes(root: Path) -> Path:
    path = root / "train" / "README"
    path.write_text("hi")
    return path


HOSTILE = [
    _link_out_file, _link_out_class, _backslash_name, _hidden_name, _empty_class, _class_only_in_val,
    _not_an_image, _fifo, _no_val, _train_links_out, _one_class, _file_among_classes,
]  # fmt: skip


@pytest.mark.parametrize("spoil", HOSTILE, ids=lambda f: f.__name__.strip("_"))
def test_a_hostile_layout_is_one_data_error_naming_the_path(
    copy: Path, spoil: Callable[[Path], Path]
) -> None:
    culprit = spoil(copy)
    message = one_line_error(lambda: validate_imagenet(copy))
    assert str(culprit) in message, message


def test_a_symlink_inside_the_root_is_followed(copy: Path) -> None:
    first, second = sorted((copy / "train").iterdir())[:2]
    (second / "alias.JPEG").symlink_to(next(first.iterdir()))
    assert count_images(validate_imagenet(copy)) == (25, 8)


def test_a_corrupt_jpeg_is_one_data_error_naming_it_when_loaded(copy: Path) -> None:
    index = validate_imagenet(copy)
    bad = index.val[3][0]
    Path(bad).write_bytes(Path(bad).read_bytes()[:200])  # truncated: validation does not decode
    for workers in (0, 1):
        _, val = build_loaders(
            index, image_size=32, batch_size=4, rank=0, world_size=1, seed=0, workers=workers
        )
        message = one_line_error(lambda val=val: [batch for batch in val])
        assert bad in message and "cannot be decoded" in message


def test_only_jpeg_and_png_are_decoded_whatever_the_name(copy: Path) -> None:
    index = validate_imagenet(copy)
    gif = index.val[0][0]
    Image.new("RGB", (32, 32)).save(gif, "GIF")
    _, val = build_loaders(index, image_size=32, batch_size=4, rank=0, world_size=1, seed=0)
    assert gif in one_line_error(lambda: [batch for batch in val])
    Image.new("RGB", (32, 32)).save(gif, "PNG")  # a PNG named .JPEG, as ImageNet has one
    assert len([batch for batch in val]) == 2


# ---------------------------------------------------------------- loaders
@pytest.mark.parametrize("image_size", [32, 64])
def test_loaders_give_normalised_batches_with_their_labels(tiny: Path, image_size: int) -> None:
    index = validate_imagenet(tiny)
    train, val = build_loaders(index, image_size=image_size, batch_size=4, rank=0, world_size=1, seed=0)
    images, labels = next(iter(train))
    assert images.shape == (4, 3, image_size, image_size) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and set(labels.tolist()) <= set(range(4))
    assert -3 < images.mean() < 3 and images.min() < 0 < images.max()
    assert len(train) == 6  # 24 images, 4 a batch
    seen = torch.cat([labels for _, labels in val])
    assert seen.tolist() == [label for _, label in index.val]  # unshuffled, in order


def test_two_ranks_split_train_and_val_into_disjoint_shards(tiny: Path) -> None:
    index = validate_imagenet(tiny)
    ranks = [
        build_loaders(index, image_size=32, batch_size=3, rank=r, world_size=2, seed=5) for r in range(2)
    ]
    train_parts = [set(loader.sampler) for loader, _ in ranks]
    assert train_parts[0].isdisjoint(train_parts[1]) and len(train_parts[0] | train_parts[1]) == 24
    val_parts = [set(val.dataset.indices) for _, val in ranks]
    assert val_parts[0].isdisjoint(val_parts[1]) and val_parts[0] | val_parts[1] == set(range(8))
    assert sum(len(torch.cat([y for _, y in val])) for _, val in ranks) == count_images(index)[1]
    sampler = ranks[0][0].sampler
    first = list(sampler)
    assert list(sampler) == first  # the same order again within an epoch
    sampler.set_epoch(1)
    assert list(sampler) != first  # and another the next


def test_a_batch_larger_than_the_training_set_is_refused(tiny: Path) -> None:
    index = validate_imagenet(tiny)
    message = one_line_error(
        lambda: build_loaders(index, image_size=32, batch_size=16, rank=0, world_size=2, seed=0)
    )
    assert "batch_size=16" in message and "world_size=2" in message


# ---------------------------------------------------------------- learnable
def test_a_tiny_cnn_learns_the_synthetic_classes_in_a_few_epochs(tmp_path: Path) -> None:
    root = generate_imagenet(
        tmp_path / "ten", classes=10, train_per_class=40, val_per_class=10, resolution=32
    )
    torch.manual_seed(0)
    train, val = build_loaders(
        validate_imagenet(root), image_size=32, batch_size=16, rank=0, world_size=1, seed=0
    )
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(5):
        train.sampler.set_epoch(epoch)
        for images, labels in train:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        correct = sum((model(images).argmax(1) == labels).sum().item() for images, labels in val)
    assert correct / 100 > 0.6  # chance is 0.1
