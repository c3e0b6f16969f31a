"""Real torch.distributed on one machine: start ranks with a timeout, gather what each returns, read the launcher.

Two ways to start N ranks, both real processes in one gloo process group (nccl on GPUs):

- `run_ranks(fn, world_size=2, **kwargs)` starts them with torch.multiprocessing from Python (a notebook,
  a test). Each rank joins the group, calls fn(**kwargs) and returns a picklable value; the parent gets
  the values in rank order. `fn` is sent to the ranks by name, so it must live in an importable module.
- `run_torchrun(target, nproc=2)` runs `python -m torch.distributed.run ... target` in a subprocess and
  captures its output: the launcher a training script uses, on one machine or several.

Both pick a free port (bind to port 0), give each rank its own threads (OMP_NUM_THREADS), and stop
everything after `timeout_s`, so nothing can hang a notebook or CI. `run_ranks` starts its ranks with
forkserver on Linux and with spawn on macOS and Windows (`default_start_method`); `run_torchrun` needs a
POSIX system (it stops the job through its process group).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from .core import atomic_write, env_importing_this_ptlab

START_METHODS = ("forkserver", "spawn")
_SIGKILL = getattr(signal, "SIGKILL", 9)     # Windows' signal module has no SIGKILL
# Imported once by the fork server, so each rank starts by fork in a fraction of a second, not ~3 s.
_PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "ptlab.distributed", "ptlab.checkpoint",
            "ptlab.models"]  # DistributedDataParallel imports torch._dynamo (~2 s) when first built


def default_start_method(platform: str | None = None) -> str:
    """How run_ranks starts ranks by default: "forkserver" on Linux, "spawn" on macOS, Windows and the rest.

    forkserver (Python 3.14's default on Linux) forks each rank from one server that imported torch once, so a
    start costs a fraction of a second. Windows has no fork at all, and on macOS Python itself defaults to
    spawn because the system libraries may start threads, which makes forking unsafe there.
    """
    import multiprocessing

    platform = sys.platform if platform is None else platform
    if platform.startswith("linux") and "forkserver" in multiprocessing.get_all_start_methods():
        return "forkserver"
    return "spawn"


def collective_device(backend: str, device: torch.device | str) -> torch.device:
    """Where to put a collective's tensors: on the rank's own GPU under nccl, on the CPU under gloo.

    nccl reduces GPU memory only: a CPU tensor fails with "No backend type associated with device type
    cpu". gloo takes CPU tensors on every machine (and CUDA tensors too; the CPU is where gloo ranks train
    here). `device` is the one this rank trains on.
    """
    device = torch.device(device)
    if backend == "nccl":
        if device.type == "cpu":
            raise ValueError("nccl reduces only tensors on the rank's GPU, but this rank's device is the CPU: "
                             "use gloo for CPU ranks")
        return device
    if backend == "gloo":
        return torch.device("cpu")
    raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago: the OS picks it when we bind to port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def clean_error(text: str) -> str:
    """One error line without this machine's paths or gloo's source location ('[.../pair.cc:561] ')."""
    text = re.sub(r"\[[^\]\s]*\.(?:cc|cpp|h):\d+\]\s*", "", text.strip())
    text = re.sub(r" from '[^']*'", "", text)            # <module '__mp_main__' from '/path/x.py'>
    text = re.sub(r"\[(127\.0\.0\.1|localhost)\]:\d+", r"[\1]:PORT", text)   # a peer's port differs every run
    return re.sub(r"(?:/[\w.\-]+)+/([\w.\-]+\.py)", r"\1", text)


def last_error_line(text: str) -> str | None:
    """The last 'SomeError: message' line of a traceback or log, cleaned; None if there is none."""
    lines = [re.sub(r"^\[rank\d+\]:\s?", "", line) for line in text.splitlines()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b(: |$)", line)]
    return clean_error(errors[-1]) if errors else None


@dataclass
class RankRun:
    """What run_ranks saw: each rank's return value and output, the first failure, and the time it took."""

    world_size: int
    results: list[Any]
    outputs: list[str]
    seconds: float
    errors: dict[int, str] = field(default_factory=dict)   # rank -> its error line, first failure first
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """Every rank returned and none failed."""
        return not self.errors and not self.timed_out

    @property
    def failed_rank(self) -> int | None:
        """The rank that failed first (the root cause), or None."""
        return next(iter(self.errors), None)

    @property
    def error(self) -> str | None:
        """The first failing rank's error line, or the timeout, or None."""
        if self.errors:
            return self.errors[self.failed_rank]
        return "timed out" if self.timed_out else None

    def raise_on_failure(self) -> "RankRun":
        """This run if every rank returned; otherwise a RuntimeError with each rank's error and last output."""
        if self.ok:
            return self
        tails = "".join(f"\n  rank {r} output: {out.strip()[-300:]}"
                        for r, out in enumerate(self.outputs) if out.strip())
        raise RuntimeError(f"the ranks failed: {self.errors or 'timed out'}{tails}")


@contextlib.contextmanager
def _fds_to(path: Path) -> Iterator[None]:
    """Point file descriptors 1 and 2 at a file for the block: child processes started in it inherit them."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def _check_importable(fn: Callable) -> None:
    import importlib

    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    found = None
    if module not in (None, "__main__") and "<" not in name:
        with contextlib.suppress(Exception):
            found = importlib.import_module(module)
            for part in name.split("."):
                found = getattr(found, part)
    if found is not fn:
        raise ValueError(f"{getattr(fn, '__name__', fn)!r} cannot be imported by name from {module!r}: each rank "
                         "is a new process that imports the function it runs, so define it in a module (a .py "
                         "file), not in a notebook or inside another function")


def _write_error(folder: str, rank: int, message: str) -> None:
    """Record a rank's error as rank<N>.error: the time and the message's first line, cleaned."""
    line = clean_error(message.splitlines()[0])
    data = json.dumps({"time": time.time(), "line": line}).encode()
    atomic_write(Path(folder, f"rank{rank}.error"), lambda handle: handle.write(data))


def _read_error(path: Path) -> tuple[float, str] | None:
    """(time, line) from a rank's error file; None if there is none or it is not a whole one."""
    try:
        info = json.loads(path.read_text())
        return float(info["time"]), str(info["line"])
    except (OSError, ValueError):   # none, or not whole (JSONDecodeError): the exit code speaks instead
        return None


def _rank_main(local_rank: int, world_size: int, port: int, fn: Callable, kwargs: dict, folder: str,
               threads: int, collective_timeout_s: float, rendezvous_timeout_s: float) -> None:
    """Entry point of each rank: its own output file, one process group, fn(**kwargs), the result to a file."""
    out = os.open(Path(folder, f"rank{local_rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank),
                      LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size), OMP_NUM_THREADS=str(threads))
    torch.set_num_threads(threads)
    try:
        # The store waits for every rank to arrive (a slow start is not a failure); the group's own
        # timeout then bounds each collective.
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=local_rank == 0,
                              timeout=datetime.timedelta(seconds=rendezvous_timeout_s))
        dist.init_process_group("gloo", store=store, rank=local_rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=collective_timeout_s))
        dist.barrier()  # all connected: a rank done at once must not close its sockets under a peer still connecting
        result = fn(**kwargs)
    except BaseException as err:
        _write_error(folder, local_rank, f"{type(err).__name__}: {err}")
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        payload = pickle.dumps(result)
    except Exception as err:       # a lock, a generator, a local function...: say so, not just "exit code 1"
        kind = type(result)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        _write_error(folder, local_rank, f"the return value of rank {local_rank} could not be pickled ({name}): "
                                         f"{type(err).__name__}: {err}")
        raise
    atomic_write(Path(folder, f"rank{local_rank}.pkl"), lambda handle: handle.write(payload))
    dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int = 2, *, timeout_s: float = 60.0, threads: int = 1,
              collective_timeout_s: float = 30.0, start_method: str | None = None, **kwargs: Any) -> RankRun:
    """Start `world_size` processes in one gloo group, run fn(**kwargs) in each, return their results in rank order.

    The first rank that raises ends the job: the others are stopped and `errors` names the root cause. A rank
    killed by a signal (SIGKILL: often the out-of-memory killer) or whose return value cannot be pickled fails too.
    After `timeout_s` every rank is stopped and `timed_out` is True. `collective_timeout_s` is the process
    group's own timeout (how long a collective waits for a peer; joining the group may take up to timeout_s).
    `start_method` None means `default_start_method()`: "forkserver" on Linux, "spawn" elsewhere.
    "forkserver" (Python 3.14's default on Linux) forks each rank from a server that imported torch once;
    "spawn" starts a fresh interpreter (Python's default on macOS and Windows; Windows has no forkserver).
    Both send `fn` by name, so it must be importable; with forkserver a function that is not is refused
    here, before anything starts. The fork server is multiprocessing's own, one per Python process: the
    first forkserver call starts it with torch preloaded and its output sent to /dev/null.
    """
    import multiprocessing

    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__}")
    for name, value in (("world_size", world_size), ("threads", threads)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    for name, value in (("timeout_s", timeout_s), ("collective_timeout_s", collective_timeout_s)):
        if not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    if start_method is None:
        start_method = default_start_method()
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    if start_method == "forkserver":
        _check_importable(fn)  # a forkserver child cannot report a failed import: refuse here, clearly
        if "forkserver" not in multiprocessing.get_all_start_methods():
            raise ValueError(f"start_method 'forkserver' does not exist on this platform ({sys.platform}): "
                             "use 'spawn' (the default here)")
        from multiprocessing import forkserver

        multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
        with _fds_to(Path(os.devnull)):  # the server's own output (none expected) never reaches a notebook cell
            forkserver.ensure_running()
    args = (fn, kwargs, world_size, threads, collective_timeout_s, timeout_s, start_method)
    run = _launch(*args)
    if any("address already in use" in line.lower() for line in run.errors.values()):
        run = _launch(*args)       # the free port was taken between picking and binding it: once more
    return run


def _launch(fn: Callable, kwargs: dict, world_size: int, threads: int, collective_timeout_s: float,
            timeout_s: float, start_method: str) -> RankRun:
    """One start of the ranks on a fresh free port; waits, stops and collects (see run_ranks)."""
    from multiprocessing.connection import wait

    import torch.multiprocessing as tmp

    with tempfile.TemporaryDirectory(prefix="ptlab-ranks-") as folder:
        launch_log = Path(folder, "launch.log")
        start = time.perf_counter()
        with _fds_to(launch_log):  # a rank that dies before its first line (spawn's import of fn) lands here
            context = tmp.start_processes(
                _rank_main, args=(world_size, free_port(), fn, kwargs, folder, threads, collective_timeout_s,
                                  timeout_s), nprocs=world_size, join=False, start_method=start_method)
        procs, deadline, timed_out = context.processes, start + timeout_s, False
        while any(p.exitcode is None for p in procs) and not any(p.exitcode for p in procs):
            left = deadline - time.perf_counter()
            if left <= 0:
                timed_out = True
                break
            wait([p.sentinel for p in procs if p.exitcode is None], timeout=min(left, 1.0))
        seconds = time.perf_counter() - start
        running = {rank for rank, proc in enumerate(procs) if proc.exitcode is None}   # what _stop ends
        _stop(procs)
        results, outputs, failures = [], [], []
        for rank, proc in enumerate(procs):
            base = Path(folder, f"rank{rank}")
            results.append(pickle.loads(base.with_suffix(".pkl").read_bytes())
                           if base.with_suffix(".pkl").exists() else None)
            outputs.append(base.with_suffix(".log").read_text() if base.with_suffix(".log").exists() else "")
            error = _read_error(base.with_suffix(".error"))
            stopped = rank in running and proc.exitcode in (-signal.SIGTERM, -_SIGKILL)
            if error is not None:
                failures.append((error[0], rank, error[1]))
            elif proc.exitcode not in (0, None) and not stopped:   # died before or outside Python's error handling
                failures.append((0.0, rank, _exit_line(proc.exitcode, launch_log)))
        errors = {rank: line for _, rank, line in sorted(failures)}
    return RankRun(world_size, results, outputs, seconds, errors, timed_out)


def _exit_line(exitcode: int, launch_log: Path) -> str:
    """Why a rank that wrote no error line ended: the signal that killed it, or its exit code."""
    if exitcode == -_SIGKILL:
        return "killed by signal 9 (SIGKILL): often the out-of-memory killer"
    if exitcode == -signal.SIGTERM:
        return "killed by signal 15 (SIGTERM)"
    return last_error_line(launch_log.read_text()) or f"exited with code {exitcode}"


def _stop(procs: list) -> None:
    """SIGTERM every rank still alive, then SIGKILL after a short grace period."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    end = time.perf_counter() + 3.0
    for proc in procs:
        proc.join(timeout=max(0.0, end - time.perf_counter()))
        if proc.is_alive():
            proc.kill()
            proc.join()


# ---------------------------------------------------------------- torchrun in a subprocess

@dataclass
class LaunchResult:
    """A finished (or stopped) torchrun: its exit code, captured output and wall time."""

    command: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def root_cause_rank(self) -> int | None:
        """The rank torchrun reports as the first failure, or None."""
        match = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", self.stderr, re.S)
        return int(match.group(1)) if match else None

    def error_of(self, rank: int) -> str | None:
        """The last error line of `rank`'s traceback (torchrun prefixes each of its lines with '[rankN]:')."""
        lines = [line for line in self.stderr.splitlines() if line.startswith(f"[rank{rank}]:")]
        return last_error_line("\n".join(lines))

    @property
    def usage_errors(self) -> list[str]:
        """The distinct 'prog: error: ...' lines argparse printed (every rank prints its own)."""
        return list(dict.fromkeys(line for line in self.stderr.splitlines() if ": error: " in line))


def torchrun_command(target: list[str], nproc: int = 2, *, nnodes: int = 1, node_rank: int | None = None,
                     rdzv_endpoint: str | None = None, python: str | None = None) -> list[str]:
    """`python -m torch.distributed.run` with c10d rendezvous; `target` is a script and its args, or
    ['-m', mod, ...]."""
    if not isinstance(nproc, int) or nproc < 1 or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nproc and nnodes must be positive ints, got {nproc!r} and {nnodes!r}")
    endpoint = rdzv_endpoint or f"127.0.0.1:{free_port()}"
    command = [python or sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
               f"--nproc-per-node={nproc}"]
    if node_rank is not None:
        command.append(f"--node-rank={node_rank}")
    return command + ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", *target]


def multinode_command(nnodes: int = 2, nproc: int = 8, endpoint: str = "node0.example:29500",
                      target: str = "-m ptlab train --epochs 30") -> str:
    """The command to type on every machine of a multi-node job: the same line everywhere.

    No --node-rank: with c10d rendezvous torchrun numbers the machines itself (the flag is for static rendezvous).
    """
    return (f"torchrun --nnodes={nnodes} --nproc-per-node={nproc} "
            f"--rdzv-backend=c10d --rdzv-endpoint={endpoint} --rdzv-id=job42 {target}")


def run_torchrun(target: list[str], nproc: int = 2, *, timeout_s: float = 120.0, cwd: str | Path | None = None,
                 env: dict[str, str] | None = None, threads: int = 1) -> LaunchResult:
    """Run `torchrun --nproc-per-node=nproc target` on this machine with a free port; kill it all after timeout_s."""
    result = _torchrun_once(target, nproc, timeout_s, cwd, env, threads)
    if "address already in use" in result.stderr.lower() and result.returncode != 0:
        result = _torchrun_once(target, nproc, timeout_s, cwd, env, threads)   # the port was taken meanwhile
    return result


def _torchrun_once(target: list[str], nproc: int, timeout_s: float, cwd: str | Path | None,
                   env: dict[str, str] | None, threads: int) -> LaunchResult:
    command = torchrun_command(target, nproc)
    environment = env_importing_this_ptlab({**os.environ, "OMP_NUM_THREADS": str(threads), **(env or {})})
    if cwd is not None:
        Path(cwd).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)   # its own process group: the workers too
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        timed_out = True
    return LaunchResult(command, proc.returncode, stdout, stderr, time.perf_counter() - start, timed_out)
