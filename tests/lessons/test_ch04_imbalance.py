"""ptlab.lessons.ch04_cnn_training.imbalance: the imbalanced split, class weights, the two samplers and the remedies."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from ptlab.data import normalize_uint8, uint8_split
from ptlab.lessons.ch04_cnn_training.imbalance import (
    backbone_features,
    class_weights,
    head_batches,
    imbalanced_indices,
    train_head,
)
from ptlab.reference import FINETUNE_CLASSES, class_indices, pretrained_backbone, relabel


def test_imbalanced_indices_keep_the_first_images_of_the_minority_only() -> None:
    idx = imbalanced_indices("cross", keep=20)
    labels = relabel(uint8_split(True)[1][idx], FINETUNE_CLASSES)
    assert torch.bincount(labels).tolist() == [800, 800, 20, 800]
    assert torch.equal(idx[labels == 2], class_indices(["cross"])[:20])
    with pytest.raises(ValueError, match="minority"):
        imbalanced_indices("circle", keep=20)
    with pytest.raises(ValueError, match="keep"):
        imbalanced_indices("cross", keep=0)


def test_class_weights_balance_the_classes_and_reject_an_empty_class() -> None:
    labels = torch.tensor([0] * 6 + [1] * 3 + [2])
    w = class_weights(labels, 3)
    assert torch.allclose(w, torch.tensor([10 / 18, 10 / 9, 10 / 3]))
    assert torch.allclose(torch.bincount(labels, weights=w[labels]), torch.full((3,), 10 / 3))   # equal total weight
    assert torch.equal(class_weights(torch.tensor([0, 1, 2, 3]), 4), torch.ones(4))
    with pytest.raises(ValueError, match="at least one"):
        class_weights(torch.tensor([0, 0, 2]), 3)


def test_weighted_mean_divides_by_the_sum_of_the_target_weights() -> None:
    torch.manual_seed(0)
    logits, y, w = torch.randn(64, 4), torch.randint(0, 4, (64,)), torch.tensor([0.5, 1.0, 2.0, 8.0])
    each = F.cross_entropy(logits, y, weight=w, reduction="none")
    assert torch.allclose(each, w[y] * F.cross_entropy(logits, y, reduction="none"))
    assert torch.allclose(F.cross_entropy(logits, y, weight=w), each.sum() / w[y].sum())


def test_head_batches_balanced_draws_the_rare_class_a_quarter_of_the_time() -> None:
    labels = torch.tensor([0] * 300 + [1] * 300 + [2] * 10 + [3] * 300)
    features = torch.arange(len(labels), dtype=torch.float32)[:, None]
    uniform = torch.cat([y for _, y in head_batches(features, labels, "uniform", steps=100)])
    balanced = torch.cat([y for _, y in head_batches(features, labels, "balanced", steps=100)])
    assert len(uniform) == len(balanced) == 6400
    assert (uniform == 2).float().mean() < 0.03
    assert 0.2 < (balanced == 2).float().mean() < 0.3
    drawn = torch.cat([X[:, 0] for X, _ in head_batches(features, labels, "balanced", steps=100)]).long()
    assert torch.equal(labels[drawn], balanced)                      # features and labels stay paired
    with pytest.raises(ValueError, match="sampler"):
        head_batches(features, labels, "oversample", steps=1)


def test_backbone_features_are_pooled_and_restore_the_mode() -> None:
    backbone = pretrained_backbone().train()
    f = backbone_features(backbone, torch.arange(3))
    assert f.shape == (3, backbone.head.in_features) and backbone.training
    with torch.no_grad():
        backbone.eval()
        expected = backbone.pool(backbone.features(
            normalize_uint8(uint8_split(True)[0][:3]))).flatten(1)
    assert torch.allclose(f, expected)


def test_train_head_remedies_recover_a_rare_class_on_separable_features() -> None:
    g = torch.Generator().manual_seed(0)
    centres = torch.eye(3) * 2.0
    labels = torch.tensor([0] * 400 + [1] * 400 + [2] * 8)
    features = centres[labels] + 0.8 * torch.randn(len(labels), 3, generator=g)
    test_labels = torch.arange(3).repeat_interleave(200)
    test_features = centres[test_labels] + 0.8 * torch.randn(600, 3, generator=g)
    recall = {}
    for remedy in ("none", "weight", "sampler"):
        head = train_head(features, labels, num_classes=3, remedy=remedy, steps=150)
        with torch.no_grad():
            recall[remedy] = (head(test_features[400:]).argmax(1) == 2).float().mean().item()
    assert recall["weight"] > recall["none"] + 0.2 and recall["sampler"] > recall["none"] + 0.2
    with pytest.raises(ValueError, match="remedy"):
        train_head(features, labels, num_classes=3, remedy="focal")
