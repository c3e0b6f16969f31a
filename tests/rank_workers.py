"""Functions the run_ranks tests start in their ranks: a module of their own, so a rank imports it in a moment."""
import os
import signal
import threading

import torch.distributed as dist


def killed_on_rank(rank: int = 1) -> int:
    """`rank` is killed by SIGKILL (what the out-of-memory killer does); the others return their rank."""
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    return dist.get_rank()


def unpicklable_on_rank(rank: int = 1) -> object:
    """`rank` returns a lock, which pickle refuses; the others return their rank."""
    return threading.Lock() if dist.get_rank() == rank else dist.get_rank()
