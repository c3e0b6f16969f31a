"""ptlab.lessons.ch04_cnn_training.finetune: the download guard has teeth, and the few-shot data is seeded and
balanced."""
from __future__ import annotations

import urllib.request

import pytest
import torch

from ptlab.lessons.ch04_cnn_training.finetune import (
    DownloadBlocked,
    few_shot_batches,
    few_shot_indices,
    largest_change,
    new_class_accuracy,
    no_downloads,
    pretrained_class_accuracy,
    running_stats,
)
from ptlab.reference import FINETUNE_CLASSES, pretrained_backbone


def test_no_downloads_blocks_fetching_weights_and_records_the_url(tmp_path) -> None:
    import torch.hub
    from torchvision.models import ResNet18_Weights, resnet18

    before = (torch.hub.urlopen, urllib.request.urlopen)
    with no_downloads() as attempts:
        weights = ResNet18_Weights.DEFAULT
        assert weights.meta["num_params"] > 0 and weights.transforms() is not None
        resnet18(weights=None)
        assert attempts == []
        with pytest.raises(DownloadBlocked, match="resnet18"):
            weights.get_state_dict(progress=False, model_dir=str(tmp_path))   # an empty cache: it must download
        with pytest.raises(DownloadBlocked):
            urllib.request.urlopen("https://example.org")
    assert attempts == [weights.url, "https://example.org"]
    assert (torch.hub.urlopen, urllib.request.urlopen) == before                # restored on exit
    assert not list(tmp_path.rglob("*.pth"))                                   # nothing was written


def test_few_shot_indices_are_seeded_and_balanced() -> None:
    from ptlab.data import CLASSES, uint8_split

    idx = few_shot_indices(per_class=5, seed=1)
    assert torch.equal(idx, few_shot_indices(per_class=5, seed=1))
    assert not torch.equal(idx, few_shot_indices(per_class=5, seed=2))
    _, labels = uint8_split(True)
    names = [CLASSES[i] for i in labels[idx].tolist()]
    assert all(names.count(n) == 5 for n in FINETUNE_CLASSES) and len(names) == 5 * len(FINETUNE_CLASSES)
    X, y = next(few_shot_batches(per_class=5, batch_size=16))
    assert X.shape == (16, 3, 32, 32) and int(y.max()) < len(FINETUNE_CLASSES)
    with pytest.raises(ValueError, match="per_class"):
        few_shot_indices(per_class=0)


def test_accuracies_and_running_stats() -> None:
    model = pretrained_backbone()
    assert 0.5 < pretrained_class_accuracy(model) <= 1.0                       # chance is 1/6
    model.head = torch.nn.Linear(model.head.in_features, len(FINETUNE_CLASSES))
    assert 0.0 <= new_class_accuracy(model) <= 1.0
    before = running_stats(model)
    assert largest_change(before, running_stats(model)) == 0.0
    model.train()
    with torch.no_grad():
        model(next(few_shot_batches(per_class=5))[0])
    assert largest_change(before, running_stats(model)) > 0.0
    with pytest.raises(ValueError, match="same tensors"):
        largest_change(before, before[:1])


def test_batch_stepper_takes_one_adamw_step_per_call_in_train_mode() -> None:
    from ptlab.lessons.ch04_cnn_training.finetune import batch_stepper

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)).eval()
    X, y = torch.randn(8, 3, 2, 2), torch.arange(8) % 3
    with torch.no_grad():
        first = torch.nn.functional.cross_entropy(model(X), y).item()
    step, losses = batch_stepper(model, (X, y), lr=5e-2)
    before = [p.detach().clone() for p in model.parameters()]
    step()
    assert model.training and losses == [pytest.approx(first)]           # the loss before the step, recorded
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before))
    for _ in range(19):
        step()
    assert len(losses) == 20 and losses[-1] < 0.5 * losses[0]
