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


def test_with_aux_head_uses_aux_only_when_told():
    from ptlab.lessons.ch07_ddp.rank_functions import WithAuxHead

    model = WithAuxHead()
    X = torch.randn(4, 8)
    assert torch.equal(model(X), model.body(X))                            # aux unused by default
    model.use_aux = True
    out = model(X)
    out.sum().backward()
    assert out.shape == (4, 3) and model.aux.weight.grad is not None


def test_static_graph_trains_the_unused_head_and_refuses_a_graph_that_changes():
    from ptlab.distributed import run_ranks
    from ptlab.lessons.ch07_ddp.rank_functions import train_with_unused_head

    settings = (dict(), dict(static_graph=False), dict(aux_steps=(2, 3)), dict(aux_steps=(1,)),
                dict(static_graph=False, aux_steps=(1,)))
    static, found, grows, shrinks, searched = (run_ranks(train_with_unused_head, **kwargs).raise_on_failure().results
                                               for kwargs in settings)
    assert [r["step"] for r in static + found] == [0] * 4
    assert torch.equal(static[0]["weights"], static[1]["weights"])
    assert torch.equal(static[0]["weights"], found[0]["weights"])          # the same steps as find_unused_parameters
    assert [(r["step"], r["phase"]) for r in grows] == [(2, "backward")] * 2
    assert all("graph has changed" in r["error"] for r in grows)
    assert [(r["step"], r["phase"]) for r in shrinks] == [(3, "forward")] * 2
    assert all("Expected to have finished reduction" in r["error"] for r in shrinks)
    assert not torch.equal(shrinks[0]["weights"], shrinks[1]["weights"])   # step 2's gradients were not averaged
    assert [r["step"] for r in searched] == [0, 0]                         # find_unused_parameters: no error
    assert torch.equal(searched[0]["weights"], searched[1]["weights"])
