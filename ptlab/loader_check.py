"""Point it at your DataLoader: samples/s, time waiting for data vs computing, and what to try next.

    report = check_loader(loader, compute=simulated_step(0.01), warmup_batches=2, max_batches=30)
    print(report)          # throughput, wait vs compute, a one-line verdict

Without `compute=` there is nothing to compare the waiting with: the report measures the loader alone
(and, with `workers=(0, 1, 2)`, the same loader at each worker count) and says the verdict is unknown.
"""
from __future__ import annotations

import contextlib
import re
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from .claims import measured
from .workers import usable_cpus

INPUT_BOUND_WAIT_SHARE = 0.3  # waiting more than this share of the time: the input pipeline is the limit
KEEPS_UP_WAIT_SHARE = 0.1     # waiting less than this share: the loader keeps up
_SAMPLE_ERROR = re.compile(r"sample (\d+) raised ([\w.]+): ")


class LoaderCheckError(RuntimeError):
    """Loading a sample failed; carries the sample index and the original exception type and message."""

    def __init__(self, message: str, index: int | None = None, original_type: str = "", original_message: str = ""):
        super().__init__(message)
        self.index, self.original_type, self.original_message = index, original_type, original_message


class SampleLoadError(RuntimeError):
    """Raised inside a worker by IndexReportingDataset: 'sample <i> raised <Type>: <message>'."""


class IndexReportingDataset(Dataset):
    """Wraps a map-style dataset so an exception in __getitem__ names the sample index that raised it.

    Every other attribute is the wrapped dataset's, read and written: a worker_init_fn that sets
    `get_worker_info().dataset.rng` (ptlab.workers.seed_worker_numpy_rng) reaches the real dataset.
    """

    def __init__(self, base: Dataset) -> None:
        object.__setattr__(self, "base", base)

    def __getattr__(self, name: str) -> Any:
        if name == "base":                 # not set yet (unpickling in a worker): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.base, name, value)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.base[index]
        except Exception as err:
            raise SampleLoadError(f"sample {index} raised {type(err).__name__}: {err}") from err


def simulated_step(seconds: float) -> Callable[[Any], None]:
    """A stand-in compute step that takes `seconds` without using the CPU, like a model step on an accelerator."""
    if not isinstance(seconds, (int, float)) or seconds < 0:
        raise ValueError(f"seconds must be a number >= 0, got {seconds!r}")

    def step(batch: Any) -> None:
        time.sleep(seconds)

    return step


@dataclass(frozen=True)
class LoaderReport:
    """What check_loader measured over the batches after warm-up, and its verdict."""

    batches: int
    samples: int
    wait_s: float
    compute_s: float
    first_batch_s: float
    num_workers: int
    verdict: str
    next_step: str
    by_workers: tuple[tuple[int, float], ...] = ()   # (num_workers, samples/s of the loader alone), if asked

    @property
    def samples_per_s(self) -> float:
        return self.samples / max(self.wait_s + self.compute_s, 1e-12)

    @property
    def batches_per_s(self) -> float:
        return self.batches / max(self.wait_s + self.compute_s, 1e-12)

    @property
    def wait_share(self) -> float:
        """Share of the measured time spent waiting for the next batch."""
        return self.wait_s / max(self.wait_s + self.compute_s, 1e-12)

    @property
    def samples_per_s_by_workers(self) -> dict[int, float]:
        """Samples/s of the loader alone per num_workers (empty unless check_loader was given workers=)."""
        return dict(self.by_workers)

    @property
    def input_bound(self) -> bool:
        return self.verdict == "input-bound"

    def __str__(self) -> str:
        # Times, rates and shares depend on the machine: printed through measured() ('≈', masked by nbval),
        # in fixed units so the text around them is the same everywhere. Counts and the verdict are exact.
        per_workers = [f"  loader alone, num_workers={w}: {measured(rate)} samples/s" for w, rate in self.by_workers]
        return "\n".join([
            f"loader check over {self.batches} batches ({self.samples} samples) after warm-up, "
            f"num_workers={self.num_workers}",
            f"  throughput       {measured(self.samples_per_s)} samples/s, {measured(self.batches_per_s)} batches/s",
            f"  waiting for data {measured(self.wait_s)} s ({measured(100 * self.wait_share, 2)}%)",
            f"  compute step     {measured(self.compute_s)} s ({measured(100 * (1 - self.wait_share), 2)}%)",
            f"  first batch      {measured(self.first_batch_s)} s"
            + (" (worker start-up included)" if self.num_workers else ""),
            *per_workers,
            f"  verdict          {self.verdict}: {self.next_step}",
        ])

    __repr__ = __str__


def _count_samples(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (tuples, lists and dicts are searched)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, dict):
        return next((_count_samples(v) for v in batch.values()), 1)
    if isinstance(batch, (list, tuple)) and batch:
        return _count_samples(batch[0]) if isinstance(batch[0], (torch.Tensor, dict, list, tuple)) else len(batch)
    return 1


def _rebuild(loader: DataLoader, *, dataset: Dataset | None = None, num_workers: int | None = None) -> DataLoader:
    """The same DataLoader (sampler, collate, generator, worker settings) over another dataset and/or num_workers."""
    dataset = loader.dataset if dataset is None else dataset
    workers = loader.num_workers if num_workers is None else num_workers
    settings: dict[str, Any] = dict(num_workers=workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                                    worker_init_fn=loader.worker_init_fn, generator=loader.generator)
    if hasattr(loader, "in_order"):
        settings["in_order"] = loader.in_order
    if workers > 0:                       # these settings exist only for worker processes
        settings.update(timeout=loader.timeout, multiprocessing_context=loader.multiprocessing_context,
                        persistent_workers=loader.persistent_workers)
        if loader.num_workers > 0:
            settings["prefetch_factor"] = loader.prefetch_factor
    if isinstance(loader.dataset, IterableDataset):
        return DataLoader(dataset, batch_size=loader.batch_size, drop_last=loader.drop_last, **settings)
    if loader.batch_sampler is not None:
        return DataLoader(dataset, batch_sampler=loader.batch_sampler, **settings)
    return DataLoader(dataset, batch_size=None, sampler=loader.sampler, **settings)


def _with_index_reporting(loader: DataLoader) -> DataLoader:
    """The same loader over IndexReportingDataset(dataset): a failing sample is then named by its index."""
    if isinstance(loader.dataset, IterableDataset):
        return loader  # no indices to report
    return _rebuild(loader, dataset=IndexReportingDataset(loader.dataset))


def _sample_error(err: Exception) -> LoaderCheckError | None:
    if not isinstance(err, SampleLoadError):
        return None
    text = str(err)  # in a worker: the worker's whole traceback, ending with our message
    matches = list(_SAMPLE_ERROR.finditer(text))
    if not matches:
        return None
    found = matches[-1]
    index, kind, message = int(found.group(1)), found.group(2), text[found.end():].strip()
    where = " in a DataLoader worker" if "DataLoader worker process" in text else ""
    return LoaderCheckError(f"loading sample {index} raised {kind}{where}: {message}", index, kind, message)


NO_COMPUTE_STEP = ("no compute step was given, so waiting for data cannot be weighed against computing: pass "
                   "compute=<your training step> (or simulated_step(seconds)) for a verdict")


def _verdict(wait_share: float, num_workers: int, has_compute: bool = True) -> tuple[str, str]:
    if not has_compute:   # the loader alone always waits 100% of the time: that says nothing about the bottleneck
        return "unknown", NO_COMPUTE_STEP
    if wait_share < KEEPS_UP_WAIT_SHARE:
        return "compute-bound", ("the loader keeps up; speed up the step itself (batch size, mixed precision, "
                                 "torch.compile) before touching the loader")
    label = "input-bound" if wait_share >= INPUT_BOUND_WAIT_SHARE else "partly input-bound"
    # Amdahl: a loader that never makes the step wait removes the waiting, and nothing more.
    gain = (f"waiting is {measured(100 * wait_share, 2)}% of the time, so a loader that never makes the step wait "
            f"trains at most {measured(1 / (1 - wait_share), 3)}x faster; ")
    cores = usable_cpus()
    if num_workers == 0:
        # No core count in this line: the report is stored in notebooks that must read the same on every machine.
        return label, gain + ("load in parallel: try num_workers=2, then more while samples/s rises, up to the cores "
                              "this process may use (beyond them if samples wait on disk or network)")
    if num_workers < cores:
        return label, gain + (f"raise num_workers towards {cores}, the cores this process may use (beyond them if "
                              "samples wait on disk or network)")
    return label, gain + ("the workers already match the cores: if a sample waits on a disk or the network, more "
                          "workers than cores can still help (measure with throughput_by_workers); if it is CPU "
                          "work, make each sample cheaper (per-batch transforms after collation, cached decoded "
                          "data, smaller files)")


def check_loader(loader: Iterable, compute: Callable[[Any], Any] | None = None, *, warmup_batches: int = 2,
                 max_batches: int = 50, workers: Iterable[int] | None = None) -> LoaderReport:
    """Iterate a loader, time waiting for each batch vs `compute(batch)`, and say which one limits throughput.

    Without `compute` the verdict is "unknown": the loader alone is measured, and nothing is claimed about
    whether training would wait for it. `workers=(0, 1, 2)` (a DataLoader only) also measures the loader alone
    at each of those num_workers, one after the other, for the report's `samples_per_s_by_workers`.
    """
    worker_counts = _check_args(loader, compute, warmup_batches, max_batches, workers)
    by_workers = tuple((w, check_loader(_rebuild(loader, num_workers=w), warmup_batches=warmup_batches,
                                        max_batches=max_batches).samples_per_s) for w in worker_counts)
    num_workers = getattr(loader, "num_workers", 0)
    with _random_state_kept(loader):           # measuring must not change the next epoch's shuffle or seeds
        timed = _timed_pass(_with_index_reporting(loader) if isinstance(loader, DataLoader) else loader,
                            compute, warmup_batches, max_batches)
    total = timed.wait_s + timed.compute_s
    verdict, next_step = _verdict(timed.wait_s / total if total > 0 else 0.0, num_workers, compute is not None)
    return LoaderReport(timed.batches, timed.samples, timed.wait_s, timed.compute_s, timed.first_batch_s,
                        num_workers, verdict, next_step, by_workers)


@contextlib.contextmanager
def _random_state_kept(loader: Any) -> Iterator[None]:
    """Give the loader's generators (its own and its sampler's) and torch's global RNG back their states."""
    generators = {id(g): g for g in (getattr(loader, "generator", None),
                                     getattr(getattr(loader, "sampler", None), "generator", None),
                                     getattr(getattr(getattr(loader, "batch_sampler", None), "sampler", None),
                                             "generator", None))
                  if isinstance(g, torch.Generator)}
    states = {key: g.get_state() for key, g in generators.items()}
    global_state = torch.get_rng_state()
    try:
        yield
    finally:
        for key, g in generators.items():
            g.set_state(states[key])
        torch.set_rng_state(global_state)


def _check_args(loader: Iterable, compute: Callable | None, warmup_batches: int, max_batches: int,
                workers: Iterable[int] | None) -> list[int]:
    """check_loader's argument checks; returns the worker counts to sweep (none without `workers`)."""
    if isinstance(loader, (str, bytes)) or not isinstance(loader, Iterable):
        raise TypeError(f"loader must be an iterable of batches such as a torch DataLoader, "
                        f"got {type(loader).__name__}")
    if compute is not None and not callable(compute):
        raise TypeError(f"compute must be a callable taking a batch, or None, got {type(compute).__name__}")
    if not isinstance(warmup_batches, int) or warmup_batches < 0:
        raise ValueError(f"warmup_batches must be an int >= 0, got {warmup_batches!r}")
    if not isinstance(max_batches, int) or max_batches < 1:
        raise ValueError(f"max_batches must be an int >= 1, got {max_batches!r}")
    worker_counts = [] if workers is None else list(workers)
    if workers is not None:
        if not worker_counts or any(not isinstance(w, int) or isinstance(w, bool) or w < 0 for w in worker_counts):
            raise ValueError(f"workers must be ints >= 0, such as (0, 1, 2), got {worker_counts!r}")
        if not isinstance(loader, DataLoader):
            raise TypeError(f"workers= needs a torch DataLoader to rebuild, got {type(loader).__name__}")
    dataset = getattr(loader, "dataset", None)
    if dataset is not None and hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError("loader: its dataset is empty (len 0), so there is nothing to measure")
    return worker_counts


@dataclass
class _TimedPass:
    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0
    compute_s: float = 0.0
    first_batch_s: float = 0.0


def _timed_pass(loader: Iterable, compute: Callable | None, warmup_batches: int, max_batches: int) -> _TimedPass:
    """One pass: seconds waiting for each batch and computing on it, after `warmup_batches` untimed ones."""
    timed, seen = _TimedPass(), 0
    batch_iter = iter(loader)
    try:
        while seen < warmup_batches + max_batches:
            start = time.perf_counter()
            try:
                batch = next(batch_iter)
            except StopIteration:
                break
            waited = time.perf_counter() - start
            start = time.perf_counter()
            if compute is not None:
                compute(batch)
            computed = time.perf_counter() - start
            if seen == 0:
                timed.first_batch_s = waited
            if seen >= warmup_batches:
                timed.wait_s, timed.compute_s = timed.wait_s + waited, timed.compute_s + computed
                timed.batches, timed.samples = timed.batches + 1, timed.samples + _count_samples(batch)
            seen += 1
    except SampleLoadError as err:
        found = _sample_error(err) or LoaderCheckError(str(err))
        err.__traceback__ = None  # a re-raised worker error holds its frame, and the frame the loader: free them now
        raise found from None
    finally:
        del batch_iter  # shuts non-persistent workers down now, not at garbage collection
    if seen == 0:
        raise ValueError("loader: it yielded no batches (an empty dataset, or drop_last with fewer samples "
                         "than one batch)")
    if timed.batches == 0:
        raise ValueError(f"loader: only {seen} batches, all used for warm-up; lower warmup_batches "
                         f"(now {warmup_batches}) or give it more data")
    return timed


def throughput_by_workers(dataset: Dataset, worker_counts: Iterable[int] = (0, 1, 2), *, batch_size: int = 32,
                          max_batches: int = 16, repeats: int = 3, **loader_kwargs: Any) -> dict[int, float]:
    """Samples/s of the same dataset per num_workers, measured in interleaved rounds; the median of each."""
    counts = list(worker_counts)
    if not counts or any(not isinstance(w, int) or w < 0 for w in counts):
        raise ValueError(f"worker_counts must be ints >= 0, got {counts!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    rates: dict[int, list[float]] = {w: [] for w in counts}
    for _ in range(repeats):
        for workers in counts:
            with warnings.catch_warnings():  # torch warns when workers outnumber cores: that is the experiment
                warnings.filterwarnings("ignore", message="This DataLoader will create")
                loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, **loader_kwargs)
                rates[workers].append(check_loader(loader, max_batches=max_batches).samples_per_s)
    return {w: statistics.median(r) for w, r in rates.items()}


def cpu_seconds_per_sample(dataset: Dataset, samples: int = 200) -> float:
    """CPU time one process spends per sample of dataset[i] (process time: other programs do not inflate it)."""
    if len(dataset) == 0:
        raise ValueError("dataset is empty: no sample to time")
    samples = min(samples, len(dataset))
    start = time.process_time()
    for index in range(samples):
        dataset[index]
    return (time.process_time() - start) / samples
