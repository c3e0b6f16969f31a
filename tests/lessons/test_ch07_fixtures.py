"""Chapter 7's fixtures: the metric pitfall's data and classifier, rank functions, one-process demonstrations."""
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
    assert shrinks[0]["allreduces"] == [[(0, 199)], []]                    # one bucket of all 199; step 2: none
    assert [r["step"] for r in searched] == [0, 0]                         # find_unused_parameters: no error
    assert torch.equal(searched[0]["weights"], searched[1]["weights"])


def test_a_loaders_generator_decides_the_worker_seeds_of_every_rank():
    from ptlab.lessons.ch07_ddp.one_process import rank_worker_seeds

    own = [rank_worker_seeds(0, rank, loader_generator=False) for rank in (0, 1)]
    shared = [rank_worker_seeds(0, rank, loader_generator=True) for rank in (0, 1)]
    assert len(set(own[0] + own[1])) == 4 and own[0][1] == own[0][0] + 1     # base seed + worker id
    assert shared[0] == shared[1]


def test_adam_hardly_notices_a_halved_gradient_unless_its_weight_decay_is_coupled():
    from ptlab.lessons.ch07_ddp.one_process import halved_gradient_drift

    share = {(opt, wd): (lambda d, u: d / u)(*halved_gradient_drift(opt, weight_decay=wd))
             for opt, wd in (("SGD", 0.0), ("Adam", 0.0), ("AdamW", 0.01), ("Adam", 0.01))}
    assert abs(share["SGD", 0.0] - 0.5) < 0.01                             # half the gradient, half the step
    assert share["Adam", 0.0] < 1e-3 and share["AdamW", 0.01] < 1e-3
    assert share["Adam", 0.01] > 0.5


def test_a_decision_all_reduced_stops_every_rank_and_sync_batchnorm_is_refused_on_the_cpu():
    from ptlab.distributed import run_ranks
    from ptlab.lessons.ch07_ddp.rank_functions import stop_together, sync_batchnorm_on_cpu

    together = run_ranks(stop_together, stop_rank=1, stop_after=2).raise_on_failure().results
    assert [r["steps"] for r in together] == [2, 2] and torch.equal(together[0]["weights"], together[1]["weights"])
    refused = run_ranks(sync_batchnorm_on_cpu).raise_on_failure().results
    assert all(r["DDP(model)"].startswith("ValueError: SyncBatchNorm layers only work with GPU") for r in refused)
