"""Chapter 6 exercises: one correct float16 AMP training step, and a bf16 sum returned in float32."""
from __future__ import annotations

import torch
from torch import nn

from ptlab.course.exercises import Wrong, calls_stub, exercise
from ptlab.lessons.ch06_amp.exercise_figures import FIGURES

_STALE = 1e6          # a gradient left in .grad before the first step, as an earlier iteration leaves one
_SCALE = 256.0        # the check's scaler starts here and doubles after every clean step (growth_interval=1)


def _problem(seed: int = 0):
    """A regression batch whose gradient norm (about 5) is above max_norm=1, so clipping acts."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(64, 8, generator=g)                    # (64, 8)
    y = X @ torch.randn(8, 1, generator=g)                 # (64, 1)
    torch.manual_seed(seed)
    return nn.Linear(8, 1), X, y


def _setup(stale: bool = True):
    """A fresh model (the same weights every call), its SGD optimizer and scaler, the batch."""
    model, X, y = _problem()
    if stale:
        for p in model.parameters():
            p.grad = torch.full_like(p, _STALE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=_SCALE, growth_interval=1)
    return model, opt, scaler, X, y


def _batches(X, y):
    """The three batches the check passes: the second one's float16 gradients overflow, so its step is skipped."""
    return [(X, y), (100 * X, 100 * y), (X, y)]


# What a GradScaler error means, by the words of its message.
_SCALER_ERRORS = [   # the most specific first: "since the last update()" ends two messages
    ("unscale_() has already been called", "scaler.unscale_(opt) ran twice before update(): once per step is "
                                           "enough (scaler.step does not unscale again)."),
    # A missing update() is named by the scale check after step 1, before these two can be reached: here they mean
    # a second scaler.step, or unscale_ after the step, within one step.
    ("step() has already been called since the last update()", "scaler.step(opt) ran twice in one step: call it "
                                                               "once, then scaler.update() once."),
    ("unscale_() is being called after step()", "scaler.unscale_(opt) came after scaler.step(opt): unscale, then "
                                                "clip, then step, then update."),
    ("No inf checks were recorded prior to update", "scaler.update() found no inf/NaN checks to use: it needs "
                                                    "one scaler.step(opt) (not opt.step()) since the previous "
                                                    "update(), so call it once per step, after scaler.step(opt)."),
    ("No inf checks were recorded for this optimizer", "no parameter had a gradient when scaler.unscale_ or "
                                                       "scaler.step ran: did something clear .grad (zero_grad) "
                                                       "between backward() and the step?"),
]

# The typical mistakes, by the name their stored weights have in FIGURES.
_MISTAKES = [
    ("without zero_grad", "the weights moved as if a gradient left in .grad from before your step were still "
                          "there (the check leaves one, as an earlier iteration would): what clears .grad?"),
    ("without unscale_", "clip_grad_norm_ measured the scaled gradients, so the update came out about scale "
                         "times too small: in what units are the gradients right after backward?"),
    ("without clipping", "the update was not clipped to max_norm."),
]


@exercise(
    id="ch6-amp-step", chapter=6,
    task="write amp_step(model, opt, scaler, X, y, max_norm): one training step of model on (X, y) with the mean "
         "squared error nn.functional.mse_loss(model(X), y), under float16 autocast on the CPU, with the GradScaler "
         "`scaler` and gradient clipping to max_norm; return the loss (unscaled)",
    hint="follow the gradients through the step: in what units are they after scaler.scale(loss).backward(), and "
         "in what units should clip_grad_norm_ measure them? Which scaler call lets the next step run?",
)
def check_amp_step(amp_step) -> None:
    model, opt, scaler, X, y = _setup()
    figures = FIGURES["ch6-amp-step"]
    seen = []                                              # (autocast on?, its dtype) at each forward
    model.register_forward_pre_hook(
        lambda *_: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))))
    for step, (X_step, y_step) in enumerate(_batches(X, y)):
        before, scale_before = [p.detach().clone() for p in model.parameters()], scaler.get_scale()
        try:
            loss = calls_stub(amp_step, model, opt, scaler, X_step, y_step, 1.0)
        except (RuntimeError, AssertionError) as err:
            meaning = next((m for words, m in _SCALER_ERRORS if words in str(err)), None)
            if meaning is None:
                raise
            raise Wrong(f"step {step + 1} raised {type(err).__name__}: {err} That means: {meaning}") from None
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise Wrong(f"return the loss as a one-element tensor, not {type(loss).__name__}.")
        if step == 0:
            _check_first_step(loss.item(), figures["loss at step 1"], seen)
        if step == 1 and not all(torch.equal(b, p) for b, p in zip(before, model.parameters())):
            raise Wrong("the check's second batch makes the float16 gradients overflow to inf, and your step still "
                        "changed the weights: which call skips a step whose gradients hold inf or NaN?")
        if not _same_weights(model, figures["weights after each step"][step]):
            raise Wrong(_diagnose(model, step + 1))
        expected_scale = figures["scale after each step"][step]
        if scaler.get_scale() == scale_before != expected_scale:
            raise Wrong(f"the scale stayed {scale_before} through step {step + 1}: scaler.update() is missing (only "
                        "update() changes the scale; call it once after scaler.step(opt)).")
        if scaler.get_scale() != expected_scale:
            raise Wrong(f"after step {step + 1} the scale is {scaler.get_scale()}, expected {expected_scale}: "
                        "is scaler.update() called exactly once per step?")


def _check_first_step(loss: float, expected: float, seen: list) -> None:
    if not seen:
        raise Wrong("your step never called model(X).")
    enabled, dtype = seen[0]
    if not enabled:
        raise Wrong("model(X) ran without autocast: wrap the forward pass and the loss in "
                    "torch.amp.autocast('cpu', dtype=torch.float16).")
    if dtype != torch.float16:
        raise Wrong(f"autocast ran in {dtype}: the task asks for torch.float16, the dtype that needs a scaler.")
    if abs(loss - expected * _SCALE) <= 1e-2 * expected * _SCALE:
        raise Wrong("you returned the scaled loss: return the loss itself (scaler.scale(loss) is for backward).")
    if abs(loss - expected) > 1e-2 * abs(expected):
        raise Wrong(f"the first step returned a loss of {loss:.4g}, but the mean squared error of this batch is "
                    f"{expected:.4g}: the task asks for nn.functional.mse_loss(model(X), y).")


def _weights(model: nn.Module) -> torch.Tensor:
    """The model's parameters in one vector: the weight (1, 8), then the bias."""
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _same_weights(model: nn.Module, stored: list[float]) -> bool:
    return torch.allclose(_weights(model), torch.tensor(stored), rtol=1e-3, atol=1e-5)


def _diagnose(model: nn.Module, steps: int) -> str:
    """Name the mistake whose first `steps` steps give the learner's weights; else say how far they are."""
    figures = FIGURES["ch6-amp-step"]
    for mistake, message in _MISTAKES:
        if _same_weights(model, figures[f"weights after each step {mistake}"][steps - 1]):
            return message
    right = torch.tensor(figures["weights after each step"][steps - 1])
    moved = (_weights(model) - right).abs().max().item()
    return (f"after step {steps} the weights differ from a correct step's by up to {moved:.3g}, and they match none "
            "of the usual mistakes the check knows: compare your order of calls with the chapter's GradScaler section.")


@exercise(
    id="ch6-fp32-accumulator", chapter=6,
    task="write stable_sum(values): the sum of a bfloat16 tensor, returned as a float32 tensor within a relative "
         "error of 1e-3 of the exact sum (about 1 on this total near 1000)",
    hint="torch's sum already adds bfloat16 values in float32 inside; what happens to the total when it is "
         "returned as bfloat16? How far apart are the bfloat16 numbers near 1000?",
)
def check_fp32_accumulator(stable_sum) -> None:
    g = torch.Generator().manual_seed(0)
    values = (torch.rand(4096, generator=g) * 0.5).to(torch.bfloat16)   # sum about 1014
    total = calls_stub(stable_sum, values)
    if not isinstance(total, torch.Tensor):
        raise Wrong(f"return a tensor, not {type(total).__name__}.")
    expected = values.double().sum().item()
    if total.dtype != torch.float32:
        why = (": between 512 and 1024 bfloat16 holds only multiples of 4, so the exact sum "
               f"{expected:.4f} cannot be returned in it" if total.dtype == torch.bfloat16 else "")
        raise Wrong(f"the result is {total.dtype}, and the task asks for a float32 tensor{why}.")
    if abs(total.item() - expected) > 1e-3 * abs(expected):
        rounded = values.sum().float().item()
        cause = (" That is the bfloat16 total converted afterwards: convert before the total is rounded."
                 if total.item() == rounded else "")
        raise Wrong(f"the sum is {total.item():.4f}, expected {expected:.4f}.{cause}")
