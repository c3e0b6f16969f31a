"""The embedded dataset: the file, its checks, the generator, and the torchvision-style views of it."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from ptlab import data
from ptlab.shapes import generate_images, shape_mask
from ptlab.data import (
    CLASSES,
    DATASET_FILE,
    DATASET_SHA256,
    MEAN,
    STD,
    DatasetError,
    EmbeddedImages,
    export_image_folder,
    load_arrays,
    load_dataset,
    to_float_tensors,
    verify_dataset,
)


def test_file_is_small_and_verified() -> None:
    assert DATASET_FILE.is_file()
    assert DATASET_FILE.stat().st_size < 25 * 2**20
    assert verify_dataset() == DATASET_SHA256
    readme = (DATASET_FILE.parent / "README.md").read_text()
    assert DATASET_SHA256 in readme and all(name in readme for name in CLASSES)


@pytest.mark.parametrize("train, n", [(True, 8000), (False, 2000)])
def test_shapes_dtypes_and_balance(train: bool, n: int) -> None:
    images, labels = load_arrays(train)
    assert images.shape == (n, 32, 32, 3) and images.dtype == np.uint8
    assert labels.shape == (n,) and labels.dtype == np.int64
    assert np.bincount(labels, minlength=len(CLASSES)).tolist() == [n // len(CLASSES)] * len(CLASSES)
    assert load_arrays(train)[0] is images  # cached: loaded and verified once per process
    assert not images.flags.writeable


def test_classes() -> None:
    assert len(CLASSES) == 10 and len(set(CLASSES)) == 10
    assert all(name == name.lower() and name.isidentifier() for name in CLASSES)
    assert {"arrow_up", "arrow_down"} <= set(CLASSES)


def test_a_corrupted_copy_is_refused(tmp_path) -> None:
    copy = tmp_path / "ptlab_shapes_v1.npz"
    shutil.copyfile(DATASET_FILE, copy)
    with open(copy, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DatasetError, match="ptlab_shapes_v1.npz.*corrupted.*ptlab data --rebuild"):
        verify_dataset(copy)
    with pytest.raises(DatasetError, match="corrupted"):
        load_arrays(True, path=copy)


def test_a_missing_file_is_named(tmp_path) -> None:
    missing = tmp_path / "nowhere.npz"
    with pytest.raises(DatasetError, match=r"nowhere\.npz is missing.*rebuild"):
        verify_dataset(missing)
    assert issubclass(DatasetError, RuntimeError)


def test_the_generator_is_deterministic() -> None:
    a_images, a_labels = generate_images((0, 0), 30)
    b_images, b_labels = generate_images((0, 0), 30)
    c_images, _ = generate_images((1, 0), 30)
    assert np.array_equal(a_images, b_images) and np.array_equal(a_labels, b_labels)
    assert not np.array_equal(a_images, c_images)
    test_images, test_labels = generate_images((0, 1), 2000)  # the stored test split, about a second
    assert np.array_equal(test_images, load_arrays(False)[0]) and np.array_equal(test_labels, load_arrays(False)[1])
    with pytest.raises(ValueError, match="multiple of 10"):
        generate_images(0, 15)


@pytest.mark.slow
def test_rebuild_reproduces_the_file_bit_for_bit(tmp_path) -> None:
    assert data.rebuild_dataset(tmp_path / "rebuilt.npz") == DATASET_SHA256


def test_arrow_down_is_arrow_up_flipped_vertically() -> None:
    g = (np.arange(64) + 0.5) / 32 - 1.0
    y, x = np.meshgrid(g, g, indexing="ij")  # rows grow downwards, like image rows
    up, down = shape_mask("arrow_up", x, y), shape_mask("arrow_down", x, y)
    assert up.any() and np.array_equal(down, np.flipud(up))
    assert not np.array_equal(up, down)
    assert up[:32].sum() > up[32:].sum()  # the wide head of arrow_up is in the top half
    for name in CLASSES:  # every other glyph is its own horizontal mirror (rotations are symmetric too)
        if not name.startswith("arrow"):
            assert np.array_equal(shape_mask(name, x, y), np.fliplr(shape_mask(name, x, y))), name
    assert np.array_equal(up, np.fliplr(up))


def test_mean_and_std_match_the_train_split() -> None:
    images, _ = load_arrays(True)
    pixels = images.reshape(-1, 3).astype(np.float64) / 255
    assert np.allclose(pixels.mean(axis=0), MEAN, atol=1e-3)
    assert np.allclose(pixels.std(axis=0), STD, atol=1e-3)
    X, y = to_float_tensors(train=False)
    assert X.shape == (2000, 3, 32, 32) and X.dtype == torch.float32 and y.dtype == torch.int64
    assert abs(float(X.mean())) < 0.1 and abs(float(X.std()) - 1) < 0.1


def test_embedded_images_like_cifar10() -> None:
    ds = EmbeddedImages(train=False)
    assert len(ds) == 2000 and ds.classes == list(CLASSES)
    assert ds.class_to_idx["arrow_down"] == CLASSES.index("arrow_down")
    assert ds.data.shape == (2000, 32, 32, 3) and isinstance(ds.targets, list)
    image, label = ds[3]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8 and label == ds.targets[3]
    assert np.array_equal(image.permute(1, 2, 0).numpy(), ds.data[3])
    assert "Number of datapoints: 2000" in repr(ds) and "Split: Test" in repr(ds)


def test_v2_transforms_and_a_dataloader() -> None:
    from torchvision.transforms import v2

    ds = EmbeddedImages(train=True, transform=data.make_transform(augment=True), target_transform=lambda t: t + 100)
    assert "RandomCrop" in repr(ds)
    loader = DataLoader(ds, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    X, y = next(iter(loader))
    assert X.shape == (32, 3, 32, 32) and X.dtype == torch.float32 and y.min() >= 100
    plain = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    image, _ = EmbeddedImages(train=False, transform=plain)[0]
    assert image.dtype == torch.float32 and 0.0 <= float(image.min()) and float(image.max()) <= 1.0


def test_export_image_folder_round_trips(tmp_path) -> None:
    from torchvision.datasets import ImageFolder

    dest = export_image_folder(tmp_path / "shapes", train=False, per_class=3)
    folder = ImageFolder(dest)
    assert sorted(folder.classes) == sorted(CLASSES) and len(folder) == 30
    image, label = folder[0]
    assert image.size == (32, 32)
    original = load_arrays(False)[0][int(folder.samples[0][0].rsplit("/", 1)[-1].split(".")[0])]
    assert np.array_equal(np.asarray(image), original)  # PNG is lossless
    assert folder.classes[label] in CLASSES


def test_dataset_choice(monkeypatch) -> None:
    monkeypatch.setenv("PTLAB_DATASET", "bogus")
    with pytest.raises(ValueError, match="PTLAB_DATASET.*bogus.*embedded, cifar10"):
        load_dataset()
    with pytest.raises(ValueError, match="name='nope'"):
        load_dataset(name="nope")
    monkeypatch.setenv("PTLAB_DATASET", "embedded")
    assert isinstance(load_dataset(train=False), EmbeddedImages)
    monkeypatch.delenv("PTLAB_DATASET")
    assert len(load_dataset(train=False, name="embedded")) == 2000


def test_import_changes_no_global_state() -> None:
    import subprocess
    import sys

    code = ("import torch; n = torch.get_num_threads(); s = torch.initial_seed(); import ptlab.data, "
            "ptlab.models, ptlab.train; assert torch.get_num_threads() == n; assert torch.initial_seed() == s; "
            "assert ptlab.data._load_file.cache_info().currsize == 0")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_an_installed_wheel_finds_or_names_the_dataset(tmp_path) -> None:
    """`pip install .` has no data/ beside the package: PTLAB_DATA_DIR or a rebuild, with a clear error."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(root)],
                   check=True, timeout=300, capture_output=True)
    wheel = next((tmp_path / "dist").glob("ptlab-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)],
                   check=True, timeout=300, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "PTLAB_DATA_DIR"}
    env.update(PYTHONPATH=str(tmp_path / "site"), HOME=str(tmp_path / "home"))
    code = "import ptlab.data as d; print(d.__file__); print(d.load_arrays(True)[0].shape)"

    missing = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert missing.returncode == 1 and "DatasetError" in missing.stderr
    assert ("is missing" in missing.stderr and "ptlab data --rebuild" in missing.stderr
            and "PTLAB_DATA_DIR" in missing.stderr)

    found = subprocess.run([sys.executable, "-c", code], env={**env, "PTLAB_DATA_DIR": str(root / "data")},
                           cwd=tmp_path, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert str(tmp_path / "site") in found.stdout and "(8000, 32, 32, 3)" in found.stdout


def test_train_val_split_is_seeded_stratified_and_disjoint():
    from ptlab.data import train_val_split

    labels = [0] * 50 + [1] * 30 + [2] * 20
    train, val = train_val_split(labels, val_fraction=0.2, seed=3)
    assert set(train).isdisjoint(val) and sorted(train + val) == list(range(100))
    assert [sum(labels[i] == c for i in val) for c in range(3)] == [10, 6, 4]
    assert train_val_split(labels, 0.2, seed=3) == (train, val)
    assert train_val_split(labels, 0.2, seed=4) != (train, val)


def test_train_val_split_rejects_bad_input():
    import pytest

    from ptlab.data import train_val_split

    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        train_val_split([0, 1], val_fraction=1.0)
    with pytest.raises(ValueError, match="too few"):
        train_val_split([0, 0, 1], val_fraction=0.4)


def test_crops_and_flips_are_the_162_images_v2_can_draw() -> None:
    from torchvision.transforms.v2 import functional as TF

    image = EmbeddedImages(True)._images[3]
    padded = TF.pad(image, [4])
    v2_crops = [TF.crop(padded, top, left, 32, 32) for top in range(9) for left in range(9)]
    assert all(torch.equal(a, b)
               for a, b in zip(data.crops_and_flips(image), v2_crops + [TF.horizontal_flip(c) for c in v2_crops]))
    assert len(data.crops_and_flips(image)) == 162
    with pytest.raises(ValueError, match="32, 32"):
        data.crops_and_flips(torch.zeros(3, 28, 28))


def test_augment_batch_draws_exactly_the_crops_and_flips_v2_can_draw() -> None:
    images = EmbeddedImages(True)._images[:24]
    out = data.augment_batch(images, torch.Generator().manual_seed(1))
    for source, augmented in zip(images, out):
        assert any(torch.equal(augmented, c) for c in data.crops_and_flips(source))
    assert len({tuple(o.flatten()[:64].tolist()) for o in out}) > 1      # not one draw for the whole batch


def test_augment_collate_gives_normalised_augmented_batches_and_refuses_floats() -> None:
    dataset = EmbeddedImages(True)
    torch.manual_seed(0)
    X, y = next(iter(DataLoader(dataset, batch_size=8, collate_fn=data.augment_collate)))
    assert X.shape == (8, 3, 32, 32) and X.dtype == torch.float32 and y.tolist() == dataset.targets[:8]
    for i in range(8):
        candidates = [data.normalize_uint8(c[None])[0] for c in data.crops_and_flips(dataset._images[i])]
        assert any(torch.equal(X[i], c) for c in candidates)
    with pytest.raises(ValueError, match="uint8"):
        data.augment_collate([(torch.zeros(3, 32, 32), 0)])


def test_channel_stats_is_exact_and_agrees_with_float64_numpy() -> None:
    from ptlab.data import channel_stats, uint8_split

    images = uint8_split(True)[0][:700]                                   # 700: more than one internal chunk
    mean, std = channel_stats(images)
    pixels = images.permute(0, 2, 3, 1).reshape(-1, 3).numpy().astype(np.float64) / 255
    assert np.allclose(mean, pixels.mean(axis=0), rtol=0, atol=1e-12)
    assert np.allclose(std, pixels.std(axis=0), rtol=0, atol=1e-12)
    assert channel_stats(list(images.split(64))) == channel_stats(images)   # batches of a loader, same sums
    assert channel_stats(torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)) == ((1.0, 1.0, 1.0), (0.0, 0.0, 0.0))


def test_channel_stats_rejects_bad_input() -> None:
    from ptlab.data import channel_stats

    with pytest.raises(ValueError, match="uint8 tensor"):
        channel_stats(torch.zeros(2, 3, 4, 4))
    with pytest.raises(ValueError, match="at least one non-empty"):
        channel_stats([])
    with pytest.raises(ValueError, match="3 channels"):
        channel_stats([torch.zeros(1, 3, 2, 2, dtype=torch.uint8), torch.zeros(1, 1, 2, 2, dtype=torch.uint8)])


def test_denormalize_inverts_normalize() -> None:
    from ptlab.data import denormalize, uint8_split

    images = uint8_split(True)[0][:32]
    back = denormalize(data.normalize_uint8(images))
    assert (back - images / 255).abs().max() <= 1e-6
    assert (denormalize(data.normalize_uint8(images)[0]) - images[0] / 255).abs().max() <= 1e-6   # one (C, H, W) image
    with pytest.raises(ValueError, match="float tensor"):
        denormalize(images)
    with pytest.raises(ValueError, match="float tensor"):
        denormalize(torch.zeros(2, 1, 4, 4))


def test_the_mirror_symmetry_claim_of_chapter_4_fails_for_a_shape_that_is_not_symmetric() -> None:
    """04_cnn_training.ipynb, section 7 claims every class's shape is its own left-right mirror image, with the same
    expression as here; an arrow pointing sideways (arrow_up with x and y swapped) is not, and fails it."""
    grid = np.linspace(-1, 1, 64)
    gx, gy = np.meshgrid(grid, grid)

    def mirror_symmetric(mask_of) -> bool:
        return bool((mask_of(gx, gy) == mask_of(-gx, gy)).all())

    assert all(mirror_symmetric(lambda x, y, name=name: shape_mask(name, x, y)) for name in data.CLASSES)
    assert not mirror_symmetric(lambda x, y: shape_mask("arrow_up", y, x))          # an arrow pointing left
