"""Inductor on this machine: its on-disk cache per CPU capability, whether it vectorizes, its compile threads."""
from __future__ import annotations

import os
import sys

import torch

from .logs import quiet_compile_logs


def use_inductor_cache_per_cpu_capability() -> str:
    """Give Inductor's on-disk cache a directory per CPU capability (under the temp dir); return its name.

    In torch 2.14 the cache can hand back C++ generated for one vector ISA after ATEN_CPU_CAPABILITY
    selected another, and the build then fails ('at::vec has not been declared'). A directory per
    capability keeps each cache warm and right. A TORCHINDUCTOR_CACHE_DIR already set is left alone.
    Call it before the first compile, and before `import torch._dynamo`: that import sets the variable to
    Inductor's default directory, which this function would then leave alone.
    """
    import getpass
    import os
    import re
    import tempfile

    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        try:
            user = re.sub(r"[^A-Za-z0-9_.-]", "_", getpass.getuser())
        except (KeyError, OSError):   # no user name (some containers)
            user = "user"
        name = f"torchinductor_{user}_{torch.backends.cpu.get_cpu_capability().lower()}"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), name)
    return os.path.basename(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def inductor_vectorizes() -> bool:
    """Whether Inductor emits SIMD C++ here (False under ATEN_CPU_CAPABILITY=default: scalar code)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    with quiet_compile_logs():
        return bool(pick_vec_isa())


def compile_threads_rule(environ: dict[str, str] | None = None, platform: str | None = None,
                         usable_cpus: int | None = None) -> tuple[int, str]:
    """Inductor's compile_threads as torch decides it (decide_compile_threads), and which case decided it.

    TORCHINDUCTOR_COMPILE_THREADS wins; else 1 on Windows; else min(32, CPUs this process may run on:
    len(os.sched_getaffinity(0)) where the OS has it, os.cpu_count() elsewhere). The defaults read this process.
    (Inside Meta's fbcode builds torch has another rule.)
    """
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if "TORCHINDUCTOR_COMPILE_THREADS" in environ:
        return int(environ["TORCHINDUCTOR_COMPILE_THREADS"]), "TORCHINDUCTOR_COMPILE_THREADS"
    if platform == "win32":
        return 1, "Windows"
    if usable_cpus is None:
        usable_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(32, usable_cpus), f"min(32, {usable_cpus} usable CPUs)"


def compile_pools_started() -> dict[str, bool]:
    """Which compile pools Inductor started in this process: 'threads' (C++ builds) and 'subprocesses' (Triton's)."""
    from torch._inductor.async_compile import AsyncCompile

    return {"threads": AsyncCompile.pool.cache_info().currsize > 0,
            "subprocesses": AsyncCompile.process_pool.cache_info().currsize > 0}
