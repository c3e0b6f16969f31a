"""Chapter 6 pitfalls about resuming and schedules: skipped steps and a scheduler, a scaler left out of a checkpoint.

Both train under float16 autocast with a GradScaler, on a batch whose float16 gradients overflow at the default
scale, so the first steps are skipped while the scale comes down.
"""
from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

from ptlab.checkpoint import load_checkpoint, save_checkpoint
from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.lessons.ch06_amp.pitfalls import OutcomeWithTexts


SCHEDULER_WARNING = "Detected call of `lr_scheduler.step()` before `optimizer.step()`."


def _overflowing_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """A regression batch whose float16 gradients overflow at scales of 16384 and above: X (64, 8), y (64, 1)."""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(64, 8, generator=g)                    # (64, 8)
    return X, X @ torch.randn(8, 1, generator=g)           # (64, 1)


@pitfall(
    id="scheduler-on-skipped-steps", chapter=6,
    title="A scheduler stepped every iteration moves on when the GradScaler skips a step: the warm-up's first "
          "learning rates go to no update",
    symptom="torch warns 'Detected call of `lr_scheduler.step()` before `optimizer.step()`', and the first real "
            "update uses more than 2x the warm-up's first learning rate",
    why="""`scaler.step(optimizer)` does not call `optimizer.step()` when the gradients hold an inf or NaN (a fused
    optimizer, `SGD(fused=True)` or `AdamW(fused=True)`, is called anyway and skips the update inside), and the
    scale starts high (65536), so the first steps of a float16 run are often skipped while `update()` halves it
    (torch's `GradScaler` documentation says as much). A scheduler stepped every iteration does not know: it moves
    on, and the learning rates it meant for
    those steps are used by no update. Here a 3-step warm-up (0.025 to 0.1) is spent entirely on the 3 skipped
    steps. torch notices only one case: when the scheduler's first `step()` comes before any call of
    `optimizer.step()` (it checks a flag on the optimizer, which every real step since a scheduler was first made on
    this optimizer sets for good, and which a fused optimizer's call sets even when it skips), it warns that the
    two were called in the wrong order (the code did call them in the right order). Skips after the first real
    step pass without a word. (Advice, not measured here: a few skips in a long schedule change
    little; a short warm-up, or a run that keeps overflowing, loses its schedule.)""",
    catch="""Read `scaler.get_scale()` before `scaler.step()` and after `scaler.update()`: with one optimizer the
    scale drops exactly when its step was skipped (with backoff_factor < 1; with several optimizers it drops when
    any of them skipped). Count those drops, and step the scheduler only when the
    scale did not drop. (On a GPU `get_scale()` waits for the GPU: it is a sync.)""",
)
def scheduler_on_skipped_steps(buggy: bool) -> Outcome:
    X, y = _overflowing_batch()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt, scaler = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
    schedule = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=3)   # 0.025 -> 0.1
    lrs, before, after, moved = [], [], [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(7):
            opt.zero_grad()
            lrs.append(opt.param_groups[0]["lr"])
            before.append(scaler.get_scale())
            weight = model.weight.detach().clone()
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(X)                             # (64, 1) float16
            scaler.scale(nn.functional.mse_loss(out.float(), y)).backward()
            scaler.step(opt)                               # skips optimizer.step() on an inf/NaN gradient
            scaler.update()                                # ...and then halves the scale
            after.append(scaler.get_scale())
            moved.append(not torch.equal(weight, model.weight))
            if buggy:
                schedule.step()                            # BUG: also after a skipped step
            elif after[-1] >= before[-1]:                  # FIX: the scale drops only after a skipped step
                schedule.step()
    texts = [f"{w.category.__name__}: {w.message}" for w in caught]
    first_lr = next(lr for lr, m in zip(lrs, moved) if m)
    return OutcomeWithTexts(
        figures={"lr used, per iteration": " ".join(f"{lr:.4g}" for lr in lrs),
                 "scale before, per iteration": " ".join(f"{s:g}" for s in before),
                 "scale after update()": " ".join(f"{s:g}" for s in after),
                 "weights moved": " ".join("yes" if m else "no" for m in moved),
                 "steps skipped, of 7": float(moved.count(False)), "lr of the first real update": f"{first_lr:.4g}"},
        checks=[Check("the first real update's lr / the warm-up's first lr (0.025)", first_lr / 0.025, "> 2"),
                Check("warnings 'Detected call of `lr_scheduler.step()` before `optimizer.step()`'",
                      sum(SCHEDULER_WARNING in t for t in texts), ">= 1")],
        texts={"warnings": "\n".join(texts)},
    )


def _amp_steps(model: nn.Module, opt, scaler: torch.amp.GradScaler, X, y, steps: int) -> int:
    """float16 autocast steps with the scaler; returns how many were skipped (the scale dropped)."""
    skipped = 0
    for _ in range(steps):
        opt.zero_grad()
        before = scaler.get_scale()
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(X)                                 # (64, 1) float16
        scaler.scale(nn.functional.mse_loss(out.float(), y)).backward()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < before
    return skipped


@pitfall(
    id="scaler-state-not-checkpointed", chapter=6,
    title="A checkpoint without the GradScaler's state: the resumed float16 run skips steps again",
    symptom="after a resume at step 10 of 20 the scale starts over at 65536, the resumed run skips a step the "
            "uninterrupted one did not, and its weights differ from the uninterrupted run's",
    why="""The scale is state, like the optimizer's moments: a fresh `GradScaler` starts at `init_scale`
    (65536) and halves once per skipped step until the gradients of now fit (here one skip brings it to 32768,
    not the 8192 saved: the gradients have shrunk since). Each skipped step
    is an update lost, and a per-batch scheduler stepped every iteration moves on past it (the pitfall above).
    `scaler.state_dict()` holds the scale, the growth and backoff factors, the growth interval and the count of
    clean steps towards the next growth.""",
    catch="""Save `scaler.state_dict()` with the model, optimizer and scheduler, and call `scaler.load_state_dict()`
    on resume (`ptlab.train.fit` with `checkpoint_dir=` and `scaler=` saves it every epoch, and loads it with
    `resume=True`). Test a resume: 10 + 10 steps
    must give the weights of 20 straight, and the scale after the resume must be the one saved.""",
)
def scaler_state_not_checkpointed(buggy: bool) -> Outcome:
    X, y = _overflowing_batch()                            # (64, 8), (64, 1)
    torch.manual_seed(0)
    straight = nn.Linear(8, 1)
    _amp_steps(straight, torch.optim.SGD(straight.parameters(), lr=0.05), torch.amp.GradScaler("cpu"), X, y, 20)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt, scaler = torch.optim.SGD(model.parameters(), lr=0.05), torch.amp.GradScaler("cpu")
    skipped_first = _amp_steps(model, opt, scaler, X, y, 10)
    saved_scale = scaler.get_scale()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "step10.pt"
        extra = {} if buggy else {"scaler": scaler.state_dict()}   # FIX: the scaler's state goes in too
        save_checkpoint(path, model, opt, epoch=10, extra=extra)   # BUG: model and optimizer only
        model = nn.Linear(8, 1)                            # resume as a new process would: new objects
        opt, scaler = torch.optim.SGD(model.parameters(), lr=0.05), torch.amp.GradScaler("cpu")
        state = load_checkpoint(path, model, opt, restore_random=False)
        if not buggy:
            scaler.load_state_dict(state.extra["scaler"])  # FIX: the scale the run had settled on
    resumed_scale = scaler.get_scale()
    skipped_after = _amp_steps(model, opt, scaler, X, y, 10)
    drift = max((a - b).abs().max().item() for a, b in zip(model.parameters(), straight.parameters()))
    return Outcome(
        figures={"steps skipped before the save, of 10": float(skipped_first), "scale at the save": saved_scale,
                 "scale after the resume": resumed_scale, "steps skipped after the resume, of 10": float(skipped_after),
                 "largest weight difference from the uninterrupted run": drift},
        checks=[Check("steps skipped after the resume", skipped_after, "> 0"),
                Check("largest weight difference from the uninterrupted run", drift, "> 0")],
    )
