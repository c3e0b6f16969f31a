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


