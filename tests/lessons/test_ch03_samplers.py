"""Chapter 3 additions: samplers, IterableDataset sharding, worker seeds; run under spawn as well as the default."""
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, WeightedRandomSampler

from ptlab import workers
from ptlab.lessons.ch03_data import datasets


@pytest.mark.parametrize("context", [None, "spawn"])
def test_an_unsharded_stream_repeats_per_worker_and_a_sharded_one_does_not(context):
    def epoch(stream):
        loader = DataLoader(stream, batch_size=4, num_workers=2, multiprocessing_context=context)
        return sorted(v for batch in loader for v in batch.tolist())

    assert epoch(datasets.NumberStream(10)) == sorted(list(range(10)) * 2)
    assert epoch(datasets.ShardedNumberStream(10)) == list(range(10))
    assert [int(v) for v in datasets.ShardedNumberStream(5)] == list(range(5))   # no workers: the whole stream
    with pytest.raises(ValueError, match="n must be"):
        datasets.NumberStream(-1)


@pytest.mark.parametrize("context", [None, "spawn"])
def test_worker_seeds_follow_the_loader_generator(context):
    def seeds(seed):
        loader = DataLoader(datasets.WorkerSeeds(8), batch_size=2, num_workers=2, multiprocessing_context=context,
                            generator=torch.Generator().manual_seed(seed), worker_init_fn=workers.seed_numpy_from_torch)
        return {int(w): int(s) for batch in loader for w, s in zip(batch[1], batch[2])}

    first, again, other = seeds(0), seeds(0), seeds(1)
    assert set(first) == {0, 1} and first == again and first != other
    assert first[1] - first[0] == 1                       # base seed + worker id
    assert datasets.WorkerSeeds(3)[2][:2] == (2, -1)       # outside a worker


def test_weighted_sampler_balances_an_imbalanced_subset():
    labels = torch.tensor([0] * 90 + [1] * 10)
    weights = (1.0 / torch.bincount(labels).float())[labels]
    sampler = WeightedRandomSampler(weights, num_samples=2000, generator=torch.Generator().manual_seed(0))
    share_of_1 = (labels[list(sampler)] == 1).float().mean().item()
    assert 0.4 < share_of_1 < 0.6


def test_distributed_sampler_splits_indices_without_a_process_group():
    parts = [list(DistributedSampler(range(10), num_replicas=2, rank=r, shuffle=False)) for r in (0, 1)]
    assert sorted(parts[0] + parts[1]) == list(range(10)) and not set(parts[0]) & set(parts[1])




def _first_draws(generator):
    """03_data.ipynb, section 13: one sample per worker, (torch seed, first numpy draw)."""
    loader = DataLoader(datasets.WorkerSeeds(2), batch_size=1, num_workers=2, generator=generator)
    return {int(w): (int(seed), float(draw)) for _, w, seed, draw in loader}


def test_the_new_base_seed_claim_fails_when_every_start_reuses_one_seed():
    """'each new start of the workers draws a new base seed' compares two starts of a loader without a generator:
    it holds because torch draws a base seed at every start, and it fails when every start gets the same seed."""
    torch.manual_seed(5)
    first = _first_draws(None)
    assert _first_draws(None) != first                                   # the notebook's claim, as torch behaves
    same_each_start = [_first_draws(torch.Generator().manual_seed(5)) for _ in range(2)]
    assert same_each_start[1] == same_each_start[0]                      # the variant: the claim would fail


def _class_shares(inverse_class_weights: bool) -> torch.Tensor:
    """03_data.ipynb, section 11: class shares of 2000 weighted draws, 200 images of class 0 and 20 of each other."""
    from ptlab.data import load_arrays

    labels = torch.from_numpy(load_arrays(train=True)[1].copy())
    keep = torch.cat([torch.nonzero(labels == c).flatten()[:200 if c == 0 else 20] for c in range(10)])
    counts = torch.bincount(labels[keep], minlength=10)
    weights = (1.0 / counts.float())[labels[keep]] if inverse_class_weights else torch.ones(len(keep))
    sampler = WeightedRandomSampler(weights, num_samples=2000, replacement=True,
                                    generator=torch.Generator().manual_seed(0))
    return torch.bincount(labels[keep][list(sampler)], minlength=10).float() / 2000


def test_the_class_share_bounds_fail_without_inverse_class_weights():
    """The notebook's bounds (class 0 in [0.07, 0.13], every class in (0.07, 0.13)) hold with weights 1/class size and
    fail for the common mistake of weighting every sample the same (class 0 then keeps about 0.53 of the draws)."""
    balanced, uniform = _class_shares(True), _class_shares(False)
    assert 0.07 <= balanced[0] <= 0.13 and balanced.min() > 0.07 and balanced.max() < 0.13
    assert not 0.07 <= uniform[0] <= 0.13 and uniform.min() < 0.07
