"""Chapter 7 exercises: the shard each rank gets from DistributedSampler, and the cost of a ring all-reduce."""
from __future__ import annotations

import contextlib
import math

from torch.utils.data import DistributedSampler

from ptlab.course.exercises import Wrong, calls_stub, exercise
from ptlab.lessons.ch07_ddp.exercise_figures import FIGURES


@exercise(
    id="ch7-shard-indices", chapter=7,
    task="write shard(n, world_size, rank, drop_last): the indices DistributedSampler(shuffle=False) gives "
         "`rank` for a dataset of n items, padded when drop_last is False and trimmed when it is True",
    hint="every rank must get the same number of indices. When n does not divide by world_size, which indices "
         "fill the gap (drop_last=False), and which are left out (drop_last=True)? Then, which positions of "
         "that list belong to `rank`? Try n=10 on 4 ranks by hand first (the chapter printed n=11 on 2)",
)
def check_shard_indices(shard) -> None:
    cases = [(10, 2, False), (11, 2, False), (11, 2, True), (10, 4, False), (10, 4, True), (3, 4, False),
             (7, 3, False), (7, 3, True), (1, 4, False), (2, 5, False)]   # the last two pad more than n
    for n, world, drop_last in cases:
        for rank in range(world):
            expected = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False,
                                               drop_last=drop_last))
            with _sampler_refused():
                got = calls_stub(shard, n, world, rank, drop_last)
            try:
                got = [int(i) for i in got]
            except TypeError:
                raise Wrong(f"return a list of ints, got {type(got).__name__}") from None
            if got != expected:                            # say where, not what: the list is the exercise
                if len(got) != len(expected):
                    where = f" ({len(got)} indices where {len(expected)} are due)"
                else:
                    first = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
                    where = f" (the count is right; position {first} holds another index than DistributedSampler's)"
                raise Wrong(f"shard({n}, {world}, {rank}, drop_last={drop_last}) returned {got}{where}")


class _UsedTheSampler(Exception):
    pass


@contextlib.contextmanager
def _sampler_refused():
    """While the learner's shard() runs, iterating a DistributedSampler raises: the task is to compute the indices."""
    def refuse(self):
        raise _UsedTheSampler

    original = DistributedSampler.__iter__
    DistributedSampler.__iter__ = refuse
    try:
        yield
    except _UsedTheSampler:
        raise Wrong("shard iterates a DistributedSampler, the very class it is compared with: compute the indices "
                    "yourself, from n, world_size, rank and drop_last") from None
    finally:
        DistributedSampler.__iter__ = original


# (n_bytes, world_size, bytes_per_second) the check asks about; the seconds it expects are stored figures.
RING_CASES = ((1e9, 2, 1e9), (4e8, 4, 2e9), (1e6, 8, 1e10), (5e7, 1, 1e9), (3e8, 3, 1e9))


@exercise(
    id="ch7-ring-allreduce-seconds", chapter=7,
    task="write allreduce_seconds(n_bytes, world_size, bytes_per_second): the time a bandwidth-bound ring "
         "all-reduce of n_bytes takes (0 for a single rank)",
    hint="in a ring the buffer is cut into world_size chunks; count how many chunk-sized messages each rank "
         "sends while the chunks are summed around the ring, and how many more while the sums go round again",
)
def check_ring_allreduce_seconds(allreduce_seconds) -> None:
    cases = zip(RING_CASES, FIGURES["ch7-ring-allreduce-seconds"]["seconds"], strict=True)
    for (n_bytes, world, bandwidth), expected in cases:
        got = calls_stub(allreduce_seconds, n_bytes, world, bandwidth)
        if not isinstance(got, (int, float)):
            raise Wrong(f"return a number of seconds, got {type(got).__name__}")
        if not math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-12):
            ratio = got / expected if expected else float("inf")
            more = (" That is the time to send the whole buffer once. In a ring each rank sends one 1/world "
                    "chunk per step, in two phases (reduce-scatter, then all-gather): count the steps."
                    if math.isclose(got, n_bytes / bandwidth, rel_tol=1e-6) else "")
            raise Wrong(f"allreduce_seconds({n_bytes:g}, {world}, {bandwidth:g}) = {got:g}, {ratio:.3g}x the "
                        f"expected {expected:g}.{more}")
