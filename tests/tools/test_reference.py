"""ptlab.reference: the shipped weights (checked on load, clear errors) and the shared batch and accuracy helpers."""
from __future__ import annotations

import pytest
import torch

from ptlab import reference
from ptlab.data import CLASSES, uint8_split
from ptlab.models import SmallCNN
from ptlab.reference import (
    FINETUNE_CLASSES,
    PRETRAIN_CLASSES,
    WeightsError,
    accuracy_on,
    accuracy_on_test,
    augment_batch,
    batch_stream,
    class_indices,
    load_weights,
    pretrained_backbone,
    reference_model,
    relabel,
)


def test_the_shipped_weights_load_and_are_trained() -> None:
    blob = load_weights()
    assert blob["models"]["reference"]["classes"] == list(CLASSES)
    assert blob["models"]["backbone"]["classes"] == list(PRETRAIN_CLASSES)
    model = reference_model()
    assert not model.training and model.head.out_features == 10
    assert 0.4 < accuracy_on_test(model) < 0.8                      # trained, far from perfect; chance is 0.10
    assert pretrained_backbone().head.out_features == len(PRETRAIN_CLASSES)
    a, b = reference_model(), reference_model()
    a.head.weight.data.zero_()
    assert not torch.equal(a.head.weight, b.head.weight)            # each call is a fresh copy


def test_pretrain_and_finetune_classes_split_the_dataset() -> None:
    assert set(PRETRAIN_CLASSES).isdisjoint(FINETUNE_CLASSES)
    assert set(PRETRAIN_CLASSES) | set(FINETUNE_CLASSES) == set(CLASSES)


def _write(path, obj) -> None:
    torch.save(obj, path)


def test_missing_or_corrupt_weights_raise_a_clear_error(tmp_path) -> None:
    with pytest.raises(WeightsError, match="missing.*--rebuild-weights"):
        load_weights(tmp_path / "nothing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file at all")
    with pytest.raises(WeightsError, match="cannot be read.*--rebuild-weights"):
        load_weights(garbage)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(reference.weights_file().read_bytes()[:5000])
    with pytest.raises(WeightsError, match="cannot be read"):
        load_weights(truncated)
    other = tmp_path / "other.pt"
    _write(other, {"format": "something else"})
    with pytest.raises(WeightsError, match="not version 1"):
        load_weights(other)


def test_weights_that_do_not_fit_or_are_not_finite_are_refused(tmp_path) -> None:
    good = load_weights()
    wrong_width = {**good, "models": {**good["models"],
                                      "reference": {**good["models"]["reference"],
                                                    "state_dict": SmallCNN(width=8).state_dict()}}}
    _write(tmp_path / "w.pt", wrong_width)
    with pytest.raises(WeightsError, match="does not fit a SmallCNN"):
        load_weights(tmp_path / "w.pt")
    state = {k: v.clone() for k, v in good["models"]["backbone"]["state_dict"].items()}
    state["head.bias"][0] = float("nan")
    nan = {**good, "models": {**good["models"], "backbone": {**good["models"]["backbone"], "state_dict": state}}}
    _write(tmp_path / "n.pt", nan)
    with pytest.raises(WeightsError, match="non-finite"):
        load_weights(tmp_path / "n.pt")


def test_weights_are_found_beside_the_dataset(monkeypatch, tmp_path) -> None:
    from ptlab import data

    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    assert reference.weights_file() == tmp_path / "ptlab_weights_v1.pt"
    with pytest.raises(WeightsError, match="missing"):
        reference.reference_model()


def test_batch_stream_is_seeded_and_respects_indices() -> None:
    a = next(batch_stream(seed=3))
    b = next(batch_stream(seed=3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[0].shape == (64, 3, 32, 32)
    arrows = class_indices(["arrow_up", "arrow_down"])
    X, y = next(batch_stream(seed=0, indices=arrows, batch_size=128))
    assert set(y.tolist()) <= {0, 1} and X.dtype == torch.float32
    with pytest.raises(ValueError, match="indices"):
        next(batch_stream(indices=[]))


def test_augment_batch_crops_and_flips_per_image() -> None:
    images, _ = uint8_split(True)
    batch = images[:16]
    out = augment_batch(batch, torch.Generator().manual_seed(0))
    assert out.shape == batch.shape and out.dtype == torch.uint8
    assert torch.equal(out, augment_batch(batch, torch.Generator().manual_seed(0)))
    assert not torch.equal(out, batch)


def test_class_indices_and_relabel() -> None:
    _, labels = uint8_split(False)
    idx = class_indices(FINETUNE_CLASSES, train=False)
    assert len(idx) == 200 * len(FINETUNE_CLASSES)
    new = relabel(labels[idx], FINETUNE_CLASSES)
    assert sorted(set(new.tolist())) == list(range(len(FINETUNE_CLASSES)))
    assert (new == torch.tensor([FINETUNE_CLASSES.index(CLASSES[i]) for i in labels[idx].tolist()])).all()
    with pytest.raises(ValueError, match="unknown class"):
        class_indices(["dog"])
    with pytest.raises(ValueError, match="outside"):
        relabel(labels[:50], FINETUNE_CLASSES)


def test_accuracy_on_restores_every_module_mode() -> None:
    model = reference_model().train()
    model.features.eval()                                           # mixed modes, as a frozen backbone has
    stats = [b.clone() for b in model.buffers()]
    images, labels = uint8_split(False)
    acc = accuracy_on(model, images[:100], labels[:100])
    assert 0.0 <= acc <= 1.0 and model.training and not model.features.training
    assert all(torch.equal(a, b) for a, b in zip(stats, model.buffers()))
    with pytest.raises(ValueError, match="same length"):
        accuracy_on(model, images[:10], labels[:9])


@pytest.mark.slow
def test_rebuilding_gives_equivalent_not_identical_weights(tmp_path) -> None:
    """A rebuild (here, or on another CPU) trains the same recipe: the accuracy matches the shipped file's within
    a few points, which is all the course relies on; the bytes may differ between machines."""
    path = reference.rebuild_weights(tmp_path / "ptlab_weights_v1.pt")
    rebuilt = load_weights(path)["models"]["reference"]
    model = SmallCNN(width=rebuilt["width"])
    model.load_state_dict(rebuilt["state_dict"])
    assert abs(accuracy_on_test(model) - accuracy_on_test(reference_model())) < 0.05


def test_cli_data_checks_the_weights_too(capsys, monkeypatch, tmp_path) -> None:
    from ptlab import data
    from ptlab.__main__ import main

    assert main(["data"]) == 0
    out = capsys.readouterr().out
    assert "ptlab_weights_v1.pt: ok" in out and "backbone: 6 classes" in out
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)          # the dataset is still found; the weights are not
    assert main(["data"]) == 1
    assert "--rebuild-weights" in capsys.readouterr().err
