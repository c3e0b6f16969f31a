"""Chapter 4: the deep plain CNN's claims about Adam at lr=1000 fail on the cases they are about.

04_finetuning_and_bugs.ipynb claims that ten plain convolutions give a non-finite loss within 5 steps and that a
BatchNorm after each keeps all losses finite. The first fails for a shallow stack (the four-layer network of the
learning-rate-too-high pitfall stays finite), the second without BatchNorm; five steps are enough to see both.
"""
import math

from ptlab.lessons.ch04_cnn_training.pitfalls_training import adam_at_lr_1000_deep_plain_cnn


def _first_non_finite_step(losses: list[float]) -> int:
    """As the notebook counts it: the first step (from 1) whose loss is not finite, len + 1 when none."""
    return next((step for step, loss in enumerate(losses, 1) if not math.isfinite(loss)), len(losses) + 1)


def test_the_deep_plain_cnn_overflow_claim_holds_at_depth_ten_and_fails_for_a_shallow_stack():
    assert _first_non_finite_step(adam_at_lr_1000_deep_plain_cnn(batchnorm=False, steps=5)) <= 5
    shallow = adam_at_lr_1000_deep_plain_cnn(batchnorm=False, depth=3, steps=5)
    assert not _first_non_finite_step(shallow) <= 5


def test_the_batchnorm_keeps_it_finite_claim_fails_without_batchnorm():
    assert all(map(math.isfinite, adam_at_lr_1000_deep_plain_cnn(batchnorm=True, steps=5)))
    assert not all(map(math.isfinite, adam_at_lr_1000_deep_plain_cnn(batchnorm=False, steps=5)))
