"""The reference training loop: train_one_epoch, evaluate and fit, for any (X, y) loader and classifier."""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn
from tqdm.auto import tqdm
from tqdm.std import tqdm as std_tqdm   # every tqdm bar's class, the notebook's too

from .checkpoint import load_checkpoint, save_checkpoint
from .loop import (check_model, count_correct, eval_mode, require_batches, resolve_device, train_mode,
                   unpack_batch)
from .plots import notebook_figure, show_figure

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class History:
    """Per-epoch curves from fit(); `seconds` is the wall time of each epoch (train + evaluate)."""

    epoch: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    val_acc: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    best_epoch: int | None = None     # the epoch whose `monitor` value was best (fit sets it)
    stopped_early: bool = False       # fit stopped before `epochs` because of early_stopping

    def __len__(self) -> int:
        return len(self.epoch)

    @property
    def total_seconds(self) -> float:
        """Wall time of all epochs together."""
        return float(sum(self.seconds))

    def as_dict(self) -> dict[str, list]:
        """The curves as a plain dict of lists (for json or pandas)."""
        return asdict(self)

    def plot(self, title: str | None = None):
        """Loss and accuracy curves, train and validation, as a Figure never held by pyplot that a notebook draws
        when a cell ends with it (ptlab.plots.notebook_figure)."""
        from matplotlib.ticker import MaxNLocator

        fig = notebook_figure(figsize=(9, 3.4), layout="constrained")
        ax_loss, ax_acc = fig.subplots(1, 2)
        for ax, key, label in ((ax_loss, "loss", "loss"), (ax_acc, "acc", "accuracy")):
            ax.plot(self.epoch, getattr(self, f"train_{key}"), marker="o", label="train")
            ax.plot(self.epoch, getattr(self, f"val_{key}"), marker="o", label="validation")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # epochs are whole numbers
            ax.set_xlabel("epoch")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend()
        if title:
            fig.suptitle(title)
        return fig


def train_one_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn | None = None,
    device: torch.device | str | None = None,
    scaler: torch.amp.GradScaler | None = None,
    autocast_dtype: torch.dtype | None = None,
    max_batches: int | None = None,
    progress: Any = False,
    scheduler: Any = None,
) -> dict[str, float]:
    """One pass over loader in training mode; returns mean loss, accuracy, examples seen, batches and seconds.

    `progress=True` shows a tqdm bar of the batches; a tqdm bar passed as `progress` (fit's) is moved on by one
    per batch instead.
    Modes agree with evaluate(): a model in training mode is left as it is, so a submodule you put in
    eval mode (a frozen BatchNorm) keeps its running statistics; a model wholly in eval mode is trained
    in training mode. Afterwards every submodule has the mode it had before the call.
    A `scheduler` given here (e.g. OneCycleLR) is stepped after every optimizer step that was taken: when the
    GradScaler skips a step (an inf or NaN gradient), its scale drops and the scheduler is not stepped either
    (read with `get_scale()`, a GPU sync; this needs the scaler's default backoff_factor < 1).
    """
    check_model(model)
    require_batches(loader, "loader")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
        raise ValueError(f"max_batches must be a positive int or None, got {max_batches!r}")
    loss_fn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
    device = resolve_device(model, device)
    total_loss, correct, seen, batches = 0.0, 0, 0, 0
    start = time.perf_counter()
    shared = progress if isinstance(progress, std_tqdm) else None
    bar = shared if shared is not None else tqdm(desc="train", total=_length(loader), leave=False,
                                                 disable=not progress)
    with train_mode(model):
        for batch in loader:
            X, y = unpack_batch(batch, device)
            with _autocast(device, autocast_dtype):
                logits = model(X)                      # (B, num_classes)
                loss = loss_fn(logits, y)              # mean over the batch
            optimizer.zero_grad(set_to_none=True)
            stepped = True
            if scaler is not None:
                scale = scaler.get_scale() if scheduler is not None else None
                scaler.scale(loss).backward()
                scaler.step(optimizer)                 # skips optimizer.step() on an inf/NaN gradient...
                scaler.update()                        # ...and then lowers the scale
                stepped = scale is None or scaler.get_scale() >= scale
            else:
                loss.backward()
                optimizer.step()
            if scheduler is not None and stepped:      # a skipped step does not move the schedule on
                scheduler.step()
            total_loss += loss.item() * len(y)
            correct += count_correct(logits.detach(), y)
            seen += len(y)
            batches += 1
            bar.update(1)
            if shared is None:
                bar.set_postfix(loss=f"{total_loss / seen:.3f}", acc=f"{correct / seen:.3f}")
            if max_batches is not None and batches >= max_batches:
                break
    if shared is None:
        bar.close()
    if seen == 0:
        raise ValueError("loader yielded no batches: check the dataset size, batch_size and drop_last")
    return {"loss": total_loss / seen, "acc": correct / seen, "n": seen, "batches": batches,
            "seconds": time.perf_counter() - start}


def _length(loader: Iterable) -> int | None:
    """len(loader) when it has one (a DataLoader over a dataset with a length has), else None."""
    try:
        return len(loader)  # type: ignore[arg-type]
    except TypeError:
        return None


def _autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """autocast to dtype on device's type; without a dtype no autocast region at all, so a model on a device
    autocast does not know still trains, and an autocast region the caller opened stays in force."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def evaluate(
    model: nn.Module,
    loader: Iterable,
    loss_fn: LossFn | None = None,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Mean loss and accuracy over loader with model.eval() and torch.no_grad(); the model's modes are restored."""
    check_model(model)
    require_batches(loader, "loader")
    loss_fn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
    device = resolve_device(model, device)
    total_loss, correct, seen = 0.0, 0, 0
    with eval_mode(model), torch.no_grad():
        for batch in loader:
            X, y = unpack_batch(batch, device)
            logits = model(X)                      # (B, num_classes)
            total_loss += loss_fn(logits, y).item() * len(y)
            correct += count_correct(logits, y)
            seen += len(y)
    if seen == 0:
        raise ValueError("loader yielded no batches: check the dataset size, batch_size and drop_last")
    return {"loss": total_loss / seen, "acc": correct / seen, "n": seen}


def fit(
    model: nn.Module,
    train_loader: Iterable,
    val_loader: Iterable,
    optimizer: torch.optim.Optimizer,
    epochs: int | None = None,
    time_budget_s: float | None = None,
    loss_fn: LossFn | None = None,
    device: torch.device | str | None = None,
    scheduler: Any = None,
    scheduler_step: str = "epoch",
    scaler: torch.amp.GradScaler | None = None,
    autocast_dtype: torch.dtype | None = None,
    progress: bool = True,
    plot: bool = False,
    history: History | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    monitor: str = "val_acc",
    early_stopping: int | None = None,
) -> History:
    """Train for `epochs` (and/or until `time_budget_s` would be passed), evaluating val_loader after each epoch.

    val_loader is a validation split carved from the training data (ptlab.data.train_val_split): you
    choose epochs and settings on it. Keep the test split for one evaluate() at the very end.

    With a time budget, a new epoch starts only if the mean epoch time so far says it will end
    inside the budget (the first epoch of a call always runs). `scheduler.step()` is called once per
    epoch (ReduceLROnPlateau gets the `monitor` metric; give it mode="max" for an accuracy), or after
    every batch whose optimizer step was taken with scheduler_step="batch" (OneCycleLR; a step the
    GradScaler skips does not move the schedule, see train_one_epoch). Pass the History of an earlier call as
    `history` to continue it: epochs are numbered on and appended to it.

    With `checkpoint_dir`, every epoch ends with `last.pt` (model, optimizer, scheduler, GradScaler, epoch,
    history, every RNG and the train loader's `generator`, written atomically) and, when `monitor` (a
    History field such as "val_acc" or "val_loss") is the best so far, `best.pt`. With `resume=True` a run
    picks up from `last.pt` (see resume_run), in this process or a new one, and `epochs` counts the epochs
    of the whole run: a run of 4 interrupted after 2 trains 2 more, bit for bit as if never interrupted on
    the same machine. The guarantee is for a run stopped at an epoch boundary whose randomness comes from
    the global RNGs, DataLoader(generator=...) or its sampler's `generator`; state kept elsewhere (a numpy
    Generator inside your Dataset, say) is not saved, and a run killed mid-epoch resumes from the last
    finished epoch.
    `early_stopping=k` stops after k epochs without a new best.
    """
    _check_fit_args(model, train_loader, val_loader, epochs, time_budget_s, scheduler_step, history,
                    checkpoint_dir, resume, monitor, early_stopping)
    device = resolve_device(model, device)
    history = history if history is not None else History()
    folder = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if resume and (folder / "last.pt").is_file():
        history = resume_run(folder, model, optimizer, scheduler, train_loader, scaler)
    first_epoch = history.epoch[-1] + 1 if history.epoch else 1
    max_epochs = epochs if epochs is not None else 10**9
    if resume:
        max_epochs = epochs - len(history.epoch)
    # One bar that moves with every batch (an epoch can take a minute), its postfix the epoch and its figures.
    per_epoch = _length(train_loader)
    bar = tqdm(total=max_epochs * per_epoch if epochs is not None and per_epoch else None, desc="fit", unit="batch",
               disable=not progress)
    start = time.perf_counter()
    for epoch in range(first_epoch, first_epoch + max_epochs):
        if time_budget_s is not None and epoch > first_epoch and _would_pass_budget(history, start, time_budget_s):
            break
        epoch_start = time.perf_counter()
        bar.set_postfix(epoch=epoch)
        train = train_one_epoch(model, train_loader, optimizer, loss_fn, device, scaler, autocast_dtype,
                                progress=bar, scheduler=scheduler if scheduler_step == "batch" else None)
        val = evaluate(model, val_loader, loss_fn, device)
        if scheduler is not None and scheduler_step == "epoch":
            _step_scheduler(scheduler, val[monitor.removeprefix("val_")] if monitor.startswith("val_") else None)
        is_best = _record_epoch(history, epoch, train, val, time.perf_counter() - epoch_start, monitor)
        bar.set_postfix(epoch=epoch, train_acc=f"{train['acc']:.3f}", val_acc=f"{val['acc']:.3f}",
                        loss=f"{train['loss']:.3f}")
        if folder is not None:
            _save_epoch(folder, model, optimizer, scheduler, train_loader, scaler, history, epoch, is_best)
        if early_stopping is not None and history.best_epoch is not None \
                and epoch - history.best_epoch >= early_stopping:
            history.stopped_early = True
            break
    bar.close()
    if plot:
        show_figure(history.plot())
    return history


def _check_fit_args(model, train_loader, val_loader, epochs, time_budget_s, scheduler_step, history,
                    checkpoint_dir, resume, monitor, early_stopping) -> None:
    """fit's argument checks: a clear error naming the argument, before any epoch runs."""
    check_model(model)
    require_batches(train_loader, "train_loader")
    require_batches(val_loader, "val_loader")
    if epochs is None and time_budget_s is None:
        raise ValueError("give epochs, time_budget_s or both: fit needs to know when to stop")
    if epochs is not None and (not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1):
        raise ValueError(f"epochs must be a positive int or None, got {epochs!r}")
    if time_budget_s is not None and not (isinstance(time_budget_s, (int, float)) and time_budget_s > 0
                                          and math.isfinite(time_budget_s)):
        raise ValueError(f"time_budget_s must be a positive number of seconds or None, got {time_budget_s!r}")
    if scheduler_step not in ("epoch", "batch"):
        raise ValueError(f'scheduler_step must be "epoch" or "batch", got {scheduler_step!r}')
    if history is not None and not isinstance(history, History):
        raise TypeError(f"history must be a History returned by an earlier fit(), got {type(history).__name__}")
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir: the folder that holds last.pt")
    if resume and epochs is None:
        raise ValueError("resume=True needs epochs: the length of the whole run")
    if monitor not in History.__dataclass_fields__ or monitor in ("epoch", "seconds"):
        raise ValueError(f"monitor must be a History curve such as 'val_acc' or 'val_loss', got {monitor!r}")
    if early_stopping is not None and (not isinstance(early_stopping, int) or isinstance(early_stopping, bool)
                                       or early_stopping < 1):
        raise ValueError(f"early_stopping must be a positive int (epochs without improvement) or None, "
                         f"got {early_stopping!r}")


def _would_pass_budget(history: History, start: float, time_budget_s: float) -> bool:
    """Whether one more epoch of the mean length so far would end after the budget."""
    return time.perf_counter() - start + sum(history.seconds) / len(history.seconds) > time_budget_s


def _step_scheduler(scheduler: Any, metric: float | None) -> None:
    """One epoch's scheduler step; ReduceLROnPlateau gets the monitored validation metric it needs."""
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        if metric is None:
            raise ValueError("ReduceLROnPlateau needs a validation metric: monitor 'val_loss' or 'val_acc'")
        scheduler.step(metric)
    else:
        scheduler.step()


def _is_improvement(monitor: str, new: float, earlier: list[float]) -> bool:
    """Whether `new` beats every earlier value of the monitored curve (lower for a loss, higher otherwise)."""
    if not earlier:
        return True
    return new < min(earlier) if monitor.endswith("loss") else new > max(earlier)


def _record_epoch(history: History, epoch: int, train: dict, val: dict, seconds: float, monitor: str) -> bool:
    """Append one epoch to the history; returns whether it is the best so far by `monitor`."""
    history.epoch.append(epoch)
    history.train_loss.append(train["loss"])
    history.train_acc.append(train["acc"])
    history.val_loss.append(val["loss"])
    history.val_acc.append(val["acc"])
    history.seconds.append(seconds)
    curve = getattr(history, monitor)
    is_best = _is_improvement(monitor, curve[-1], curve[:-1])
    if is_best:
        history.best_epoch = epoch
    return is_best


def _save_epoch(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                train_loader: Iterable, scaler: torch.amp.GradScaler | None, history: History, epoch: int,
                is_best: bool) -> None:
    """last.pt after every epoch, and best.pt when this epoch is the best so far."""
    extra: dict[str, Any] = {"history": history.as_dict()}
    if scaler is not None:
        extra["scaler"] = scaler.state_dict()
    generators = _loader_generators(train_loader)
    for name in ("last.pt", "best.pt") if is_best else ("last.pt",):
        save_checkpoint(folder / name, model, optimizer, scheduler, epoch=epoch, generators=generators, extra=extra)


def resume_run(folder: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None,
               train_loader: Iterable | None = None, scaler: torch.amp.GradScaler | None = None) -> History:
    """Restore a run from folder/last.pt as fit wrote it; returns its History (the epochs done).

    Model, optimizer, scheduler, every RNG, the train loader's shuffling generator and the GradScaler all
    continue where the run stopped, so the next epoch is bit for bit the one an uninterrupted run would train.
    The file is read onto the CPU and each state is copied from there to where its model and optimizer live
    (load_checkpoint): a run written on a GPU resumes on a machine without one, and the random generators'
    states, which torch only takes as CPU tensors, stay on the CPU.
    """
    path = Path(folder) / "last.pt"
    state = load_checkpoint(path, model, optimizer, scheduler, generators=_loader_generators(train_loader))
    if "history" not in state.extra:
        raise ValueError(f"{path} holds no training history: it was not written by ptlab.train.fit")
    if scaler is not None and "scaler" in state.extra:
        scaler.load_state_dict(state.extra["scaler"])
    return History(**state.extra["history"])


def _loader_generators(loader: Any) -> dict[str, torch.Generator]:
    """The generators a loader shuffles with (its own, its sampler's if that holds another), to checkpoint with
    the run."""
    found: dict[str, torch.Generator] = {}
    generator = getattr(loader, "generator", None) if loader is not None else None
    if isinstance(generator, torch.Generator):
        found["train_loader"] = generator
    sampler_generator = getattr(getattr(loader, "sampler", None), "generator", None)
    if isinstance(sampler_generator, torch.Generator) and sampler_generator is not generator:
        found["train_sampler"] = sampler_generator
    return found
