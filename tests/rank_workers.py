"""Functions the run_ranks tests start in their ranks: a module of their own, so a rank imports it in a moment."""
import os
import signal
import threading

import torch
import torch.distributed as dist


def killed_on_rank(rank: int = 1) -> int:
    """`rank` is killed by SIGKILL (what the out-of-memory killer does); the others return their rank."""
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    return dist.get_rank()


def unpicklable_on_rank(rank: int = 1) -> object:
    """`rank` returns a lock, which pickle refuses; the others return their rank."""
    return threading.Lock() if dist.get_rank() == rank else dist.get_rank()


def averaged_train_curves() -> list[float]:
    """Each rank holds its own train loss per epoch; the script's _average_over_ranks replaces it by the mean."""
    from ptlab.train import History
    from ptlab.train_script import _average_over_ranks

    rank = dist.get_rank()
    history = History(epoch=[1, 2], train_loss=[1.0 + rank, 2.0 + 3 * rank], train_acc=[0.5, 0.25 * rank])
    _average_over_ranks(history, ("train_loss", "train_acc"), dist.get_world_size(), torch.device("cpu"))
    return history.train_loss + history.train_acc
