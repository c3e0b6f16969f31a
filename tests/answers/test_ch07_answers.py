"""Chapter 7 exercises: right answers accepted, typical wrong ones rejected with the hint that names the fault."""
from ptlab import check
from ptlab.lessons.ch07_ddp.exercises import RING_CASES


def shard(n, world_size, rank, drop_last):
    total = (n // world_size) * world_size if drop_last else -(-n // world_size) * world_size
    indices = list(range(n))
    while len(indices) < total:                  # pad from the start, more than once when n is tiny
        indices += indices[: total - len(indices)]
    return indices[:total][rank::world_size]


def shard_padding_once(n, world_size, rank, drop_last):
    """Right until the padding is longer than the dataset: shard(1, 4, 2, False) gives [] instead of [0]."""
    total = (n // world_size) * world_size if drop_last else -(-n // world_size) * world_size
    indices = list(range(n))
    indices += indices[: total - len(indices)]
    return indices[:total][rank::world_size]


def shard_no_padding(n, world_size, rank, drop_last):
    return list(range(rank, n, world_size))


def shard_pads_with_last(n, world_size, rank, drop_last):
    total = (n // world_size) * world_size if drop_last else -(-n // world_size) * world_size
    indices = list(range(n))
    indices += [n - 1] * (total - len(indices))
    return indices[:total][rank::world_size]


def test_shard_exercise(capsys):
    assert check("ch7-shard-indices", ...) == "not attempted"
    assert check("ch7-shard-indices", shard) == "correct"
    assert check("ch7-shard-indices", shard_no_padding) == "wrong"
    assert "(5 indices where 6 are due)" in capsys.readouterr().out
    assert check("ch7-shard-indices", shard_pads_with_last) == "wrong"
    assert "returned [1, 3, 5, 7, 9, 10]" in capsys.readouterr().out
    assert check("ch7-shard-indices", shard_padding_once) == "wrong"    # caught by the n=1 and n=2 cases
    assert "shard(1, 4, 2, drop_last=False) returned [] (0 indices where 1 are due)" in capsys.readouterr().out


def allreduce_seconds(n_bytes, world_size, bytes_per_second):
    """Reduce-scatter, then all-gather: each rank sends world_size - 1 chunks of n_bytes / world_size in each."""
    return 2 * (world_size - 1) / world_size * n_bytes / bytes_per_second


FIGURES = {   # how each stored figure is made (tests/answers/test_stored_figures.py)
    "ch7-ring-allreduce-seconds": lambda: {"seconds": [allreduce_seconds(*case) for case in RING_CASES]},
}


def test_ring_allreduce_exercise(capsys):
    assert check("ch7-ring-allreduce-seconds", ...) == "not attempted"
    assert check("ch7-ring-allreduce-seconds", allreduce_seconds) == "correct"
    assert check("ch7-ring-allreduce-seconds", lambda n, k, bw: n / bw) == "wrong"
    assert "count the steps" in capsys.readouterr().out
    assert check("ch7-ring-allreduce-seconds", lambda n, k, bw: (k - 1) / k * n / bw) == "wrong"
    assert "0.5x the expected" in capsys.readouterr().out


def test_shard_exercise_refuses_the_sampler_itself_and_does_not_print_the_answer(capsys):
    from torch.utils.data import DistributedSampler

    def one_line(n, world_size, rank, drop_last):
        return list(DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False,
                                       drop_last=drop_last))

    assert check("ch7-shard-indices", one_line) == "wrong"
    assert "compute the indices yourself" in capsys.readouterr().out
    assert list(DistributedSampler(range(4), num_replicas=2, rank=0, shuffle=False)) == [0, 2]   # restored
    assert check("ch7-shard-indices", shard_pads_with_last) == "wrong"
    out = capsys.readouterr().out
    assert "position 5 holds another index" in out and "[1, 3, 5, 7, 9, 0]" not in out
