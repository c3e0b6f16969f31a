"""Chapter 3 additions: samplers, IterableDataset sharding, worker seeds; run under spawn as well as the default."""
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, WeightedRandomSampler

from ptlab import loading


@pytest.mark.parametrize("context", [None, "spawn"])
def test_an_unsharded_stream_repeats_per_worker_and_a_sharded_one_does_not(context):
    def epoch(stream):
        loader = DataLoader(stream, batch_size=4, num_workers=2, multiprocessing_context=context)
        return sorted(v for batch in loader for v in batch.tolist())

    assert epoch(loading.NumberStream(10)) == sorted(list(range(10)) * 2)
    assert epoch(loading.ShardedNumberStream(10)) == list(range(10))
    assert [int(v) for v in loading.ShardedNumberStream(5)] == list(range(5))   # no workers: the whole stream
    with pytest.raises(ValueError, match="n must be"):
        loading.NumberStream(-1)


@pytest.mark.parametrize("context", [None, "spawn"])
def test_worker_seeds_follow_the_loader_generator(context):
    def seeds(seed):
        loader = DataLoader(loading.WorkerSeeds(8), batch_size=2, num_workers=2, multiprocessing_context=context,
                            generator=torch.Generator().manual_seed(seed), worker_init_fn=loading.seed_numpy_from_torch)
        return {int(w): int(s) for batch in loader for w, s in zip(batch[1], batch[2])}

    first, again, other = seeds(0), seeds(0), seeds(1)
    assert set(first) == {0, 1} and first == again and first != other
    assert first[1] - first[0] == 1                       # base seed + worker id
    assert loading.WorkerSeeds(3)[2][:2] == (2, -1)       # outside a worker


def test_weighted_sampler_balances_an_imbalanced_subset():
    labels = torch.tensor([0] * 90 + [1] * 10)
    weights = (1.0 / torch.bincount(labels).float())[labels]
    sampler = WeightedRandomSampler(weights, num_samples=2000, generator=torch.Generator().manual_seed(0))
    share_of_1 = (labels[list(sampler)] == 1).float().mean().item()
    assert 0.4 < share_of_1 < 0.6


def test_distributed_sampler_splits_indices_without_a_process_group():
    parts = [list(DistributedSampler(range(10), num_replicas=2, rank=r, shuffle=False)) for r in (0, 1)]
    assert sorted(parts[0] + parts[1]) == list(range(10)) and not set(parts[0]) & set(parts[1])


def test_the_seeding_exercise_runs_a_module_function_under_the_default_start_method():
    from ptlab.exercises.data_loading import _start_method_for, check_worker_seeding

    assert _start_method_for(loading.seed_worker_numpy_rng) is None
    check_worker_seeding(loading.seed_worker_numpy_rng)   # raises Wrong if the draws repeat
