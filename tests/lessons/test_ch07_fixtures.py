"""Chapter 7's fixtures for the metric pitfall: a validation set whose shards differ, and a hand-set classifier."""
import torch
from torch.utils.data import DistributedSampler

from ptlab.lessons.ch07_ddp.rank_functions import paired_validation_set, prototype_classifier


def test_rank_zero_gets_the_clean_examples_and_rank_one_their_noisy_copies():
    X, y = paired_validation_set()
    assert X.shape == (64, 8) and y.shape == (64,) and torch.equal(y[0::2], y[1::2])
    shards = [list(DistributedSampler(range(64), num_replicas=2, rank=r, shuffle=False)) for r in (0, 1)]
    assert shards == [list(range(0, 64, 2)), list(range(1, 64, 2))]      # 64 divides by 2: no padding
    assert (X[0::2].argmax(1) == y[0::2]).all()                           # the clean ones carry their class


def test_the_counts_are_the_same_on_every_machine():
    X, y = paired_validation_set()
    before = torch.get_rng_state()
    model = prototype_classifier()
    assert torch.equal(torch.get_rng_state(), before)                      # no random number drawn
    with torch.no_grad():
        logits = model(X)
    top2 = logits.topk(2, dim=1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 0.05      # no near-tie: rounding cannot change a prediction
    right = logits.argmax(1) == y
    assert (int(right[0::2].sum()), int(right[1::2].sum())) == (32, 16)   # clean 32/32, noisy 16/32
    assert torch.equal(logits, X[:, :3])                                   # class c scores feature c
