"""`python -m ptlab doctor`: is this laptop ready for the course?"""
from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from ptlab import compiling
from ptlab.amp import bf16_matmul_kind
from ptlab.core import choose_device
from ptlab.data import DATASET_FILE, verify_dataset
from ptlab.speed_ladder import speed_ladder

LOCK_FILE = Path(__file__).resolve().parents[2] / "requirements.lock"


def pinned_versions(lock: Path = LOCK_FILE) -> dict[str, str]:
    """Exact versions from requirements.lock (the one place they are pinned); empty outside a checkout."""
    if not lock.is_file():
        return {}
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^ \\;]+)", lock.read_text(encoding="utf-8"), flags=re.M)
    return {name.lower(): version for name, version in pins}


@dataclass
class ReadinessCheck:
    """One line of the report: what, the finding, and whether the course can go on without it."""

    name: str
    finding: str
    ok: bool = True
    required: bool = True
    fix: str = ""


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _version_check(package: str, fix: str) -> ReadinessCheck:
    found = _version(package)
    pinned = pinned_versions().get(package)
    if found is None:
        return ReadinessCheck(package, "not installed", ok=False, fix=fix)
    if pinned and found.split("+")[0] != pinned:
        return ReadinessCheck(package, f"{found} (the course's outputs were made with {pinned})", ok=False, fix=fix)
    return ReadinessCheck(package, found)


def _bf16_autocast(device: torch.device) -> ReadinessCheck:
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = torch.ones(4, 4, device=device) @ torch.ones(4, 4, device=device)
        ok = out.dtype == torch.bfloat16
        return ReadinessCheck("bf16 autocast", f"works on {device.type}" if ok else f"gives {out.dtype}",
                              ok=ok, required=False, fix="chapter 6 (mixed precision) then compares float32 only")
    except Exception as err:
        return ReadinessCheck("bf16 autocast", f"unavailable on {device.type}: {type(err).__name__}", ok=False,
                              required=False, fix="chapter 6 (mixed precision) then compares float32 only")


_BF16_CONSEQUENCE = {"native": "bf16 autocast can speed training up here",
                     "emulated": "bf16 autocast is slower than float32 here",
                     "fallback": "bf16 autocast is many times slower than float32 here"}


def _cpu_instructions() -> ReadinessCheck:
    """ATen's kernels, and which bf16 kernels torch runs (ptlab.amp.bf16_matmul_kind, measured once)."""
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        bf16 = bf16_matmul_kind()
    except Exception as err:  # the measurement is information: say why it is missing
        return ReadinessCheck("CPU instructions",
                              f"{capability} kernels; bf16 kernels not measured: {type(err).__name__}: {err}",
                              ok=False, required=False)
    finding = (f"{capability} kernels; {bf16.kind} bf16 kernels: {_BF16_CONSEQUENCE[bf16.kind]}. Why: {bf16.reason}. "
               f"Measured bf16/float32 matmul peak: {bf16.peak_ratio:.2g}x")
    return ReadinessCheck("CPU instructions", finding, ok=bool(bf16.agrees), required=False,
                          fix=f"chapter 6 expects a ratio {bf16.expected} for {bf16.kind} kernels: rerun make doctor "
                              "on an idle machine; if it persists, report this line (a course bug)")


INDUCTOR_COMPILER = "C++ compiler (torch.compile on CPU)"
_COMPILER_FIX = ("install a C++ compiler for chapter 8 (Debian/Ubuntu: sudo apt install g++; Fedora: sudo dnf install "
                 "gcc-c++; macOS: xcode-select --install; Windows: Visual Studio Build Tools); until then "
                 "torch.compile(backend='eager'), torch.export and ONNX export still work")


def _inductor_cxx() -> str:
    """The compiler command Inductor uses on CPU: $CXX, else clang++ on macOS, cl on Windows, g++ elsewhere.

    The same rule as torch._inductor.config.cpp.cxx (and cpp_builder.get_cpp_compiler): Inductor tries no
    other name, so finding clang++ or c++ on a Linux PATH would not help it.
    """
    default = "cl" if sys.platform == "win32" else ("clang++" if sys.platform == "darwin" else "g++")
    return os.environ.get("CXX", default) or default


def inductor_compiler_check() -> ReadinessCheck:
    """Whether the C++ compiler Inductor, torch.compile's default backend, will use is found and runs."""
    import shlex
    import subprocess

    command = _inductor_cxx()
    words = shlex.split(command) if sys.platform != "win32" else [command]
    found = shutil.which(words[0]) if words else None
    if found is None:
        return ReadinessCheck(INDUCTOR_COMPILER, f"not found: Inductor runs {command!r} ($CXX, else that default)",
                              ok=False, required=False, fix=_COMPILER_FIX)
    name = os.path.basename(found)
    if sys.platform == "win32":
        return ReadinessCheck(INDUCTOR_COMPILER, name)
    try:
        subprocess.run([found, *words[1:], "--version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as err:
        return ReadinessCheck(INDUCTOR_COMPILER, f"{name} found but does not run ({type(err).__name__})", ok=False,
                              required=False, fix=_COMPILER_FIX)
    return ReadinessCheck(INDUCTOR_COMPILER, name)


INDUCTOR_BUILD = "torch.compile build"
# Chapter 8's first compile, compiled the way the chapter compiles it: on one torch thread. Inductor's
# graph cache keys a CPU graph on the thread count (FxGraphHashDetails.cpp_runtime_thread_count in
# torch/_inductor/codecache.py), so a graph built at the machine's default count is never reused by
# the chapter. Built here, the chapter's first compile loads it from the cache.
CHAPTER_8_THREADS = 1
_FIRST_COMPILE = f"""
import time, torch
from {compiling.__name__} import quiet_compile_logs, use_inductor_cache_per_cpu_capability
use_inductor_cache_per_cpu_capability()
torch.set_num_threads({CHAPTER_8_THREADS})
start = time.perf_counter()
with quiet_compile_logs():
    torch.compile(lambda x: torch.sin(x) + 1)(torch.randn(8))
print(f"{{time.perf_counter() - start:.1f}}")
"""
# Chapter 8's speed ladder compiles a training step (forward and backward, channels_last, batches of 32 and
# 128): a minute on two cores with a cold cache. The same rungs and batch shapes as the chapter's cell
# (fewer steps), so its graphs are cached.
_LADDER_WARMUP = f"""
import time, torch
from {compiling.__name__} import quiet_compile_logs, use_inductor_cache_per_cpu_capability
use_inductor_cache_per_cpu_capability()
from {speed_ladder.__module__} import speed_ladder
start = time.perf_counter()
with quiet_compile_logs():
    speed_ladder(steps=1, warmup=1)
print(f"{{time.perf_counter() - start:.1f}}")
"""


# What a first run on a 2-core machine waits for, said before each wait. Measured with an empty Inductor cache on
# 2 shared cores: the one-line compile 15 s, the ladder 27 s (quiet) to 45 s (other jobs running); warm, 6 and 10 s.
BUILDING_HEADER = ("building Inductor's C++ header for this CPU and compiling a one-line function "
                   "(first run: about 15 s on 2 cores; later runs: a few seconds)...")
BUILDING_LADDER = ("compiling chapter 8's training step, forward and backward, so that chapter 8 starts warm "
                   "(first run: 30-45 s on 2 cores; later runs: about 10 s)...")


def _quiet(text: str) -> None:
    """A `say` that says nothing."""


def inductor_build_check(compiler: ReadinessCheck, timeout_s: float = 300.0,
                         say: Callable[[str], None] = _quiet) -> ReadinessCheck:
    """Compile chapter 8's first function with Inductor in a fresh process (the environment's CPU capability).

    It proves that the whole chain builds, not only that a compiler exists, and it leaves Inductor's
    on-disk caches for this CPU capability warm: the one-time build of its C++ header and the graphs chapter
    8 compiles first (same functions, same inputs, one thread) happen here, when the machine is prepared,
    instead of in the chapter. `say` is told what is being built before each step that takes seconds.
    """
    import subprocess

    if not compiler.ok:
        return ReadinessCheck(INDUCTOR_BUILD, "not tried: no C++ compiler", ok=False, required=False, fix=compiler.fix)
    say(BUILDING_HEADER)
    try:
        done = subprocess.run([sys.executable, "-c", _FIRST_COMPILE], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return ReadinessCheck(INDUCTOR_BUILD, f"a one-line compile did not finish in {timeout_s:.0f} s", ok=False,
                              required=False,
                              fix="chapter 8 will be slow here; close other programs and rerun make doctor")
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "Error" in line] or ["no error line"]
        return ReadinessCheck(INDUCTOR_BUILD, f"a one-line compile failed: {errors[-1].strip()[:200]}", ok=False,
                              required=False, fix=_COMPILER_FIX)
    say(BUILDING_LADDER)
    try:
        ladder = subprocess.run([sys.executable, "-c", _LADDER_WARMUP], capture_output=True, text=True,
                                timeout=timeout_s)
        ladder_text = (f", chapter 8's speed ladder in {ladder.stdout.strip()} s" if ladder.returncode == 0
                       else "; chapter 8's speed ladder did not compile here, so its cell will compile it")
    except subprocess.TimeoutExpired:
        ladder_text = f"; chapter 8's speed ladder did not compile in {timeout_s:.0f} s, so its cell will compile it"
    return ReadinessCheck(INDUCTOR_BUILD, f"a one-line function compiled in {done.stdout.strip()} s{ladder_text}; "
                                          "Inductor's cache for this CPU is now warm for chapter 8", required=False)


def _dataset() -> ReadinessCheck:
    try:
        digest = verify_dataset()
        return ReadinessCheck("embedded dataset", f"{DATASET_FILE.name} sha256 {digest[:12]}… ok")
    except Exception as err:  # DatasetError says what to do
        return ReadinessCheck("embedded dataset", str(err), ok=False, fix="see the message above")


def _jupyter() -> list[ReadinessCheck]:
    checks = [_version_check("jupyterlab", "make lab installs it"),
              _version_check("ipywidgets", "make lab installs it")]
    lab_ext = _version("jupyterlab_widgets")
    checks.append(ReadinessCheck("ipywidgets lab extension",
                                 f"jupyterlab_widgets {lab_ext}" if lab_ext else "not installed",
                                 ok=lab_ext is not None, fix="pip install jupyterlab_widgets (make lab does it)"))
    return checks


def _device() -> tuple[ReadinessCheck, torch.device]:
    try:
        choice = choose_device()
    except (ValueError, RuntimeError) as err:  # a PTLAB_DEVICE this machine cannot honour
        return ReadinessCheck("device", str(err), ok=False,
                              fix="unset PTLAB_DEVICE (the course picks cuda, mps or cpu itself) or set it to cpu"), \
            torch.device("cpu")
    return ReadinessCheck("device", str(choice), required=False), choice.device


def iter_checks(say: Callable[[str], None] = _quiet) -> Iterator[ReadinessCheck]:
    """Every readiness check, each yielded as soon as it has run, in the order the report prints them.

    `say` is told what is being built before a step that takes more than a few seconds.
    """
    device_check, device = _device()
    yield ReadinessCheck("python", platform.python_version(), ok=sys.version_info >= (3, 10),
                         fix="Python 3.10 or newer")
    yield _version_check("torch", "make lab installs the pinned version from requirements.lock")
    yield _version_check("torchvision", "make lab installs the pinned version from requirements.lock")
    yield device_check
    yield _bf16_autocast(device)
    compiler = inductor_compiler_check()
    yield compiler
    yield inductor_build_check(compiler, say=say)
    yield ReadinessCheck("CPU threads", f"{torch.get_num_threads()} torch threads, {os.cpu_count()} logical CPUs",
                         required=False)
    yield _cpu_instructions()
    yield _dataset()
    yield from _jupyter()


def run_checks() -> list[ReadinessCheck]:
    """Every readiness check, in the order the report prints them."""
    return list(iter_checks())


HEADER = "ptlab doctor"
NAME_WIDTH = len(INDUCTOR_COMPILER) + 2    # the longest check name, so lines printed one by one line up


def check_lines(check: ReadinessCheck, width: int = NAME_WIDTH) -> list[str]:
    """One check as the report prints it: its line, and its fix when it is not ok."""
    mark = "ok  " if check.ok else ("FAIL" if check.required else "warn")
    lines = [f"  [{mark}] {check.name:<{width}}{check.finding}"]
    if not check.ok and check.fix:
        lines.append(f"         {'':<{width}}-> {check.fix}")
    return lines


def note_line(text: str) -> str:
    """What the doctor is doing before a slow step, as a report line."""
    return f"  [....] {text}"


def verdict(checks: list[ReadinessCheck]) -> tuple[str, int]:
    """The report's last line and the exit code: 1 if anything required is missing."""
    missing = [c.name for c in checks if c.required and not c.ok]
    if missing:
        return (f"NOT READY: the course needs {', '.join(missing)}: follow the -> lines above "
                "(`make lab` installs every missing package).", 1)
    return "READY: everything the course needs is here.", 0


def report(checks: list[ReadinessCheck]) -> tuple[str, int]:
    """The printed report and the exit code: 1 if anything required is missing."""
    width = max([NAME_WIDTH] + [len(c.name) + 2 for c in checks])
    last, code = verdict(checks)
    return "\n".join([HEADER, *(line for c in checks for line in check_lines(c, width)), last]), code
