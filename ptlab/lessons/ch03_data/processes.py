"""Chapter 3's process probes: limit the cores a block runs on, and measure a worker's private memory."""
from __future__ import annotations

import contextlib
import os
from typing import Iterable, Iterator

from ptlab.workers import usable_cpus


@contextlib.contextmanager
def limited_cpus(count: int) -> Iterator[int]:
    """Run the block (and workers forked in it) on at most `count` cores where the OS allows; yields the count."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an int >= 1, got {count!r}")
    if not hasattr(os, "sched_setaffinity"):  # macOS, Windows: no affinity API, run unrestricted
        yield usable_cpus()
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:count])
    try:
        yield len(os.sched_getaffinity(0))
    finally:
        os.sched_setaffinity(0, before)


def private_mib(pid: int) -> float:
    """Private (unshared) memory of one process in MiB: the pages a forked worker has made its own."""
    import psutil

    return psutil.Process(pid).memory_full_info().uss / 2**20


def child_pids(exclude: Iterable[int] = ()) -> list[int]:
    """Process ids of this process's live children, leaving out `exclude` (say, those that existed before)."""
    import psutil

    skip = set(exclude)
    return [p.pid for p in psutil.Process().children() if p.is_running() and p.pid not in skip]
