"""Torch's thread pool on a busy machine: step times per thread count and OpenMP wait policy, quiet and busy."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F

from .core import PTLAB_ROOT, env_importing_this_ptlab
from .data import to_float_tensors
from .models import SmallCNN

LOADS = ("quiet", "busy")
WAIT_POLICIES = (None, "PASSIVE", "ACTIVE")
# The busy process: pure Python spinning on one core until its parent exits or `seconds` pass; it says when it spins.
_SPIN = """import os, sys, time
parent, end = os.getppid(), time.monotonic() + float(sys.argv[1])
print("spinning", flush=True)
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(200_000):
        pass
"""
_SPIN_MAX_S = 600.0


def available_cores() -> int:
    """The number of CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                                     # macOS, Windows
        return os.cpu_count() or 1


def start_busy_process(seconds: float = _SPIN_MAX_S) -> subprocess.Popen:
    """Start one process that spins in pure Python (one core's worth of load); returns once it spins.

    It stops by itself after `seconds`, or (on Linux and macOS, where a child sees its parent change) when this
    process exits; stop it sooner with stop_busy_process."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    proc = subprocess.Popen([sys.executable, "-c", _SPIN, str(float(seconds))], stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "spinning":
        stop_busy_process(proc)
        raise RuntimeError("the busy process did not start")
    return proc


def stop_busy_process(proc: subprocess.Popen) -> None:
    """Stop a process start_busy_process started (and wait for it)."""
    proc.kill()
    proc.wait()
    if proc.stdout:
        proc.stdout.close()


def _check_policy(wait_policy) -> None:
    if wait_policy not in WAIT_POLICIES:
        raise ValueError(f"wait_policy must be one of {WAIT_POLICIES}, got {wait_policy!r}")


def _check_int(name: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _measure(threads: int, loads: list[str], steps: int, batch_size: int, width: int, warmup: int) -> dict:
    """In this process: SmallCNN training step wall times (seconds) per load, the loads in the given order."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = SmallCNN(width=width).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    X, y = to_float_tensors(train=True)                        # (N, 3, 32, 32), (N,)
    X, y = X[:batch_size], y[:batch_size]                      # (B, 3, 32, 32), (B,)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(X), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    times: dict[str, list[float]] = {load: [] for load in loads}
    for load in loads:
        busy = start_busy_process() if load == "busy" else None
        try:
            for _ in range(steps):
                start = time.perf_counter()
                step()
                times[load].append(time.perf_counter() - start)
        finally:
            if busy is not None:
                stop_busy_process(busy)
    return {"times": times, "threads": torch.get_num_threads()}


def _pin_every_thread(core: int) -> None:
    """Linux: restrict every thread of this process (one entry each in /proc/self/task) to `core`; threads
    started later inherit the mask. OpenMP counted the cores when torch was imported and does not look again."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), {core})


def _measure_one_core(core: int, steps: int, batch_size: int, width: int) -> dict:
    """In this process, after pinning it to `core`: SmallCNN step wall times (seconds) on 1 torch thread, then
    on 2 (one unmeasured step first)."""
    cores_at_start = len(os.sched_getaffinity(0))              # what OpenMP counted when torch was imported
    _pin_every_thread(core)
    torch.set_num_threads(1)                                   # no OpenMP worker before the 2-thread steps
    torch.manual_seed(0)
    model = SmallCNN(width=width).train()
    X, y = to_float_tensors(train=True)                        # (N, 3, 32, 32), (N,)
    X, y = X[:batch_size], y[:batch_size]                      # (B, 3, 32, 32), (B,)

    def step() -> float:                                       # plain SGD by hand: torch.optim's first use
        start = time.perf_counter()                            # imports about a second's worth of modules
        F.cross_entropy(model(X), y).backward()
        with torch.no_grad():
            for param in model.parameters():
                param -= 0.05 * param.grad
                param.grad = None
        return time.perf_counter() - start

    step()                                                     # allocations and first-call costs, unmeasured
    times, pool_sizes, os_threads = {}, {}, {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        times[str(threads)] = [step() for _ in range(steps)]
        pool_sizes[str(threads)] = torch.get_num_threads()
        os_threads[str(threads)] = len(os.listdir("/proc/self/task"))
    masks = [sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")]
    return {"times": times, "pool_sizes": pool_sizes, "os_threads": os_threads, "cores_at_start": cores_at_start,
            "thread_masks": masks}


_CHILD_TASKS = {"measure": _measure, "one_core": _measure_one_core}


def _child_main(spec: str) -> None:
    """Entry point of the fresh child process: run the task `spec` (JSON) names and print its result as JSON."""
    args = json.loads(spec)
    print(json.dumps(_CHILD_TASKS[args.pop("task")](**args)))


# Variables that change how OpenMP threads wait: a measurement "with the policy unset" removes them all.
_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def _run_child(spec: dict, wait_policy: str | None, timeout_s: float) -> dict:
    """Run _child_main(spec) in a fresh Python started with OMP_WAIT_POLICY=`wait_policy` (None: unset, and
    GOMP_SPINCOUNT and KMP_BLOCKTIME removed too) and return its JSON result."""
    _check_policy(wait_policy)
    env = {k: v for k, v in os.environ.items() if k not in _WAIT_VARIABLES}
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy
    env = env_importing_this_ptlab(env)
    # `-c` puts the working directory first on sys.path, before PYTHONPATH: put this ptlab's folder before it.
    code = (f"import sys; sys.path.insert(0, {PTLAB_ROOT!r}); "
            f"from {__name__} import _child_main; _child_main(sys.argv[1])")
    run = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], env=env, capture_output=True, text=True,
                         timeout=timeout_s)
    if run.returncode != 0:
        raise RuntimeError(f"the measuring process failed (exit {run.returncode}): {run.stderr.strip()[-500:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


@dataclass
class StepTimes:
    """Step wall times (seconds) of one configuration, per load ('quiet', 'busy'), from one fresh process."""
    threads: int
    wait_policy: str | None
    times: dict[str, list[float]]

    def median(self, load: str) -> float:
        """Median step time (seconds) under `load`."""
        if load not in self.times:
            raise ValueError(f"load must be one of {', '.join(self.times)}, got {load!r}")
        return statistics.median(self.times[load])

    @property
    def busy_over_quiet(self) -> float:
        """Median step time beside one busy process / median step time on a quiet machine."""
        return self.median("busy") / self.median("quiet")

    @property
    def name(self) -> str:
        return f"{self.threads} thread{'s' if self.threads > 1 else ''}, OMP_WAIT_POLICY={self.wait_policy or 'unset'}"


def step_times(threads: int, wait_policy: str | None = None, loads: Sequence[str] = ("quiet", "busy"),
               rounds: int = 2, steps: int = 3, batch_size: int = 32, width: int = 32, warmup: int = 2,
               timeout_s: float = 300.0) -> StepTimes:
    """Time SmallCNN training steps on `threads` torch threads in a fresh Python process started with
    OMP_WAIT_POLICY=`wait_policy` (None: unset, the OpenMP runtime's default; the policy only takes effect
    before the runtime starts, hence the fresh process). The loads take turns, `rounds` times, `steps`
    timed steps each: 'quiet' (nothing else of ours runs) and 'busy' (one process spins in pure Python)."""
    _check_int("threads", threads, 1)
    for name, value, minimum in (("rounds", rounds, 1), ("steps", steps, 1), ("batch_size", batch_size, 2),
                                 ("width", width, 1), ("warmup", warmup, 0)):
        _check_int(name, value, minimum)
    _check_policy(wait_policy)
    loads = list(loads)
    if not loads or any(load not in LOADS for load in loads) or len(set(loads)) != len(loads):
        raise ValueError(f"loads must be distinct names from {LOADS}, got {loads!r}")
    spec = {"task": "measure", "threads": threads, "loads": loads * rounds,
            "steps": steps, "batch_size": batch_size, "width": width, "warmup": warmup}
    result = _run_child(spec, wait_policy, timeout_s)
    return StepTimes(result["threads"], wait_policy, result["times"])


@dataclass
class OneCoreTimes:
    """Step wall times (seconds) of one process pinned to one core, on 2 torch threads and on 1, with what the
    process saw: the cores it could use when torch started, and how many OS threads it had after the steps on
    each torch thread count (every one checked to be on `core` alone)."""
    wait_policy: str | None
    core: int
    times: dict[int, list[float]]
    cores_at_start: int = 0
    os_threads: dict[int, int] = field(default_factory=dict)

    def median(self, threads: int) -> float:
        """Median step time (seconds) on `threads` torch threads (1 or 2)."""
        if threads not in self.times:
            raise ValueError(f"threads must be one of {sorted(self.times)}, got {threads!r}")
        return statistics.median(self.times[threads])

    @property
    def two_over_one(self) -> float:
        """Median step time on 2 threads / median step time on 1 thread, both on the one core."""
        return self.median(2) / self.median(1)


def one_core_pinning_unavailable() -> str | None:
    """Why one_core_step_times cannot run here, or None when it can: it needs Linux (os.sched_setaffinity
    and /proc/self/task) and at least 2 cores this process may use."""
    if not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"):
        return f"pinning a running process to one core needs Linux (os.sched_setaffinity); this is {sys.platform}"
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        return f"this process may use {cores} core; taking one away needs at least 2"
    return None


def one_core_step_times(wait_policy: str | None = None, last_core: bool = False, steps: int = 3,
                        batch_size: int = 32, width: int = 32, timeout_s: float = 120.0) -> OneCoreTimes:
    """A core lost, made repeatable (Linux only): in a fresh Python started with OMP_WAIT_POLICY=`wait_policy`,
    import torch (its OpenMP runtime counts every core this process may use), then pin the process to one core
    (the first it may use, or the last: two measurements at once each get their own) and time `steps` SmallCNN
    training steps (forward, backward, a plain SGD update) on 1 torch thread, then on 2. Two of the pool's
    threads on one core is the extreme of what a pool sized for two cores meets when another program keeps one
    of them busy. The child reports its threads' CPU masks, its pool sizes and its cores at start; anything
    other than every thread on the one core, 1 then 2 torch threads, and 2 cores or more at start is an error."""
    for name, value, minimum in (("steps", steps, 1), ("batch_size", batch_size, 2), ("width", width, 1)):
        _check_int(name, value, minimum)
    _check_policy(wait_policy)
    reason = one_core_pinning_unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    cores = sorted(os.sched_getaffinity(0))
    core = cores[-1] if last_core else cores[0]
    spec = {"task": "one_core", "core": core, "steps": steps, "batch_size": batch_size, "width": width}
    result = _run_child(spec, wait_policy, timeout_s)
    if any(mask != [core] for mask in result["thread_masks"]):
        raise RuntimeError(f"the measuring process's threads ran on {result['thread_masks']}, not on core {core} alone")
    if result["pool_sizes"] != {"1": 1, "2": 2} or result["cores_at_start"] < 2:
        raise RuntimeError(f"the measuring process had {result['pool_sizes']} torch threads and "
                           f"{result['cores_at_start']} cores at start, not 1 then 2 threads on 2 cores or more")
    return OneCoreTimes(wait_policy, core, {int(k): v for k, v in result["times"].items()},
                        result["cores_at_start"], {int(k): v for k, v in result["os_threads"].items()})


def thread_pool_comparison(threads: Sequence[int] | None = None,
                           wait_policies: Sequence[str | None] = (None, "PASSIVE"), **kwargs) -> list[StepTimes]:
    """step_times for every pair of thread count (default: 1 and every available core) and wait policy,
    each in its own fresh process, quiet and beside one busy process (kwargs go to step_times)."""
    if threads is None:
        threads = sorted({1, available_cores()})
    threads, wait_policies = list(threads), list(wait_policies)
    if not threads or not wait_policies:
        raise ValueError(f"threads and wait_policies must not be empty, got {threads!r} and {wait_policies!r}")
    return [step_times(n, policy, **kwargs) for n in threads for policy in wait_policies]


def _ratio_line(results: list[StepTimes], load: str) -> str | None:
    """'default / PASSIVE' step time ratio under `load` on the most threads measured, if both were."""
    by_key = {(r.threads, r.wait_policy): r for r in results}
    most = max(r.threads for r in results)
    if most < 2 or (most, None) not in by_key or (most, "PASSIVE") not in by_key:
        return None
    ratio = by_key[most, None].median(load) / by_key[most, "PASSIVE"].median(load)
    return f"{load}: OMP_WAIT_POLICY unset / PASSIVE on {most} threads: {ratio:.2f}x"


def thread_report(batch_size: int = 32, **kwargs) -> list[str]:
    """The lines `make bench` prints: SmallCNN step times on 1 thread and on every core, OpenMP wait policy
    unset and PASSIVE, quiet and beside one busy process, with the ratios; then chapter 3's pitfall, a core
    lost (one_core_line). Information only: any failure gives a 'skipped' line."""
    try:
        lines = _report_lines(thread_pool_comparison(batch_size=batch_size, **kwargs), batch_size)
    except Exception as err:  # information, not a verdict: say why it is missing
        lines = [f"thread-pool step times skipped: {type(err).__name__}: {err}"]
    return lines + [one_core_line(batch_size=batch_size)]


def one_core_line(**kwargs) -> str:
    """One line: the step time on 2 threads / on 1 thread in a process pinned to one core after torch started,
    with the wait policy unset and PASSIVE (one_core_step_times; kwargs go to it), or why it was skipped."""
    name = "a core lost (chapter 3's pitfall): step on 2 threads / on 1, one core"
    try:
        unset, passive = (one_core_step_times(policy, last_core=last, **kwargs).two_over_one
                          for policy, last in ((None, False), ("PASSIVE", True)))
        return f"{name}: OMP_WAIT_POLICY unset {unset:.2f}x, PASSIVE {passive:.2f}x"
    except Exception as err:  # information, not a verdict
        return f"{name}: skipped: {type(err).__name__}: {err}"


def _report_lines(results: list, batch_size: int) -> list[str]:
    base = results[0].median("quiet")
    lines = [f"Torch's thread pool (chapter 3): SmallCNN training step, batch {batch_size}, median ms "
             f"({available_cores()} cores available; 'busy': one other process spins on one core)",
             f"{'configuration':<42} {'quiet':>8} {'busy':>8}  busy/quiet  vs {results[0].name} quiet"]
    for r in results:
        lines.append(f"{r.name:<42} {r.median('quiet') * 1e3:8.1f} {r.median('busy') * 1e3:8.1f}"
                     f"  {r.busy_over_quiet:9.2f}x  quiet {r.median('quiet') / base:.2f}x, busy "
                     f"{r.median('busy') / base:.2f}x")
    lines += [line for load in LOADS if (line := _ratio_line(results, load))]
    return lines
