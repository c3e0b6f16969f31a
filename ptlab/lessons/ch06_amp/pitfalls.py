"""Chapter 6 pitfalls: mixed precision with torch.amp (autocast and GradScaler).

The GradScaler pitfalls train under float16 autocast: float16 is the dtype that needs a scaler (bfloat16 has
float32's range and needs none), and float16 autocast runs on the CPU too.
"""
from __future__ import annotations

import math
import pickle
import re
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ptlab.claims import Check
from ptlab.core import PTLAB_ROOT, env_importing_this_ptlab
from ptlab.course.pitfall_record import Outcome, pitfall


def _batch(seed: int = 0, n: int = 64, features: int = 8):
    """A fixed regression batch: X (n, features), y (n, 1)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, features, generator=g)                                  # (n, F)
    y = X @ torch.randn(features, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)  # (n, 1)
    return X, y


@dataclass(frozen=True)
class OutcomeWithTexts(Outcome):
    """An Outcome that keeps long texts (a warning in full) out of the side-by-side table: `outcome.texts`."""

    texts: dict[str, str] = field(default_factory=dict)


def _steps_until_error(step, n_steps: int) -> tuple[int, str]:
    """Run step() n_steps times; return how many completed and the first error as 'Type: message'."""
    for done in range(n_steps):
        try:
            step()
        except (RuntimeError, AssertionError) as error:
            return done, f"{type(error).__name__}: {error}"
    return n_steps, "none"


FORGOTTEN_UPDATE_ERROR = "RuntimeError: step() has already been called since the last update()."


@pitfall(
    id="scaler-update-forgotten", chapter=6,
    title="Forgetting scaler.update() raises on the next step (the scale does not silently grow)",
    symptom="the 2nd scaler.step() raises RuntimeError 'step() has already been called since the last "
            "update().'; 1 of 3 steps completes, and the scale stays where it started",
    why="""`GradScaler.step()` records that it ran for this optimizer; `update()` adjusts the scale and
    clears that record. Without `update()`, the next `step()` finds the record and refuses. The scale
    never changes either: only `update()` writes it, so it neither grows nor shrinks without it.""",
    catch="""Each iteration: `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`.
    `ptlab.train.fit(..., scaler=...)` does exactly this.""",
)
def scaler_update_forgotten(buggy: bool) -> Outcome:
    X, y = _batch()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)  # x2 after every clean step

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(X).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        if not buggy:
            scaler.update()                                # FIX: update() after every step()
        # BUG: no scaler.update() -> the next step() raises

    done, error = _steps_until_error(step, 3)
    return Outcome(
        figures={"steps completed, of 3": done, "error": error, "scale after the run (started at 1024)":
                 str(scaler.get_scale())},
        checks=[Check("the 2nd step() raised RuntimeError 'step() has already been called since the last update()'",
                      error == FORGOTTEN_UPDATE_ERROR, "is True"),
                Check("steps completed, of 3", done, "== 1")],
    )


UPDATE_BEFORE_STEP_ERROR = "AssertionError: No inf checks were recorded prior to update."


@pitfall(
    id="scaler-update-before-step", chapter=6,
    title="scaler.update() before scaler.step() raises AssertionError",
    symptom="update() before step() raises AssertionError 'No inf checks were recorded prior to update.'; "
            "0 of 3 steps complete",
    why="""`update()` decides the next scale from the inf/NaN checks that `step()` (or `unscale_()`)
    recorded. Called first, it finds none and asserts. The order is `scale(loss).backward()`,
    `step(optimizer)`, then `update()`.""",
    catch="""Keep the three calls in that order, once per iteration; or let `ptlab.train.fit` do it.""",
)
def scaler_update_before_step(buggy: bool) -> Outcome:
    X, y = _batch()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(X).float(), y)
        scaler.scale(loss).backward()
        if buggy:
            scaler.update()                                # BUG: update() first: no inf checks yet
            scaler.step(opt)
        else:
            scaler.step(opt)                               # FIX: step() records the inf checks...
            scaler.update()                                # FIX: ...then update() uses them

    done, error = _steps_until_error(step, 3)
    return Outcome(
        figures={"steps completed, of 3": done, "error": error},
        checks=[Check("update() raised AssertionError 'No inf checks were recorded prior to update'",
                      error == UPDATE_BEFORE_STEP_ERROR, "is True"),
                Check("steps completed, of 3", done, "== 0")],
    )


@pitfall(
    id="clip-without-unscale", chapter=6,
    title="Gradient clipping without scaler.unscale_() clips the scaled gradients",
    symptom="clip_grad_norm_ sees a norm more than 1,000x the true one (the scale is 4096), and the applied "
            "update is less than 1/1,000 of max_norm * lr",
    why="""After `scaler.scale(loss).backward()` every `.grad` is multiplied by the scale (4096 here, a
    scale at which these float16 gradients do not overflow; 65536 by default). `clip_grad_norm_` then measures that
    scaled norm and shrinks the gradients to `max_norm`
    in scaled units; `scaler.step()` divides by the scale afterwards. Here the true norm (about 4.5) is
    above `max_norm` (1), so clipping should act anyway and the update comes out scale-times smaller
    than intended; with a true norm below `max_norm` it comes out scale * norm / max_norm times smaller.
    Nothing raises.""",
    catch="""Call `scaler.unscale_(optimizer)` before clipping (then `scaler.step()` does not unscale
    again). Log the norm `clip_grad_norm_` returns: a value near the scale times a plausible norm is this bug.""",
)
def clip_without_unscale(buggy: bool) -> Outcome:
    X, y = _batch()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=4096.0)   # 65536 would overflow these float16 gradients
    max_norm = 1.0
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.mse_loss(model(X).float(), y)
    true_norm = torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()),
                                                                     retain_graph=True)]).norm().item()
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(loss).backward()
    if not buggy:
        scaler.unscale_(opt)                               # FIX: true gradients before clipping
    seen = nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()  # BUG: without unscale_ it sees scale * norm
    scaler.step(opt)
    scaler.update()
    update = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)]).norm().item()
    return Outcome(
        figures={"true grad norm": true_norm, "norm seen by clip_grad_norm_": seen,
                 "applied update norm": update, "max_norm * lr": "1.0"},
        checks=[Check("norm seen / true norm", seen / true_norm, "> 1e3"),
                Check("applied update / (max_norm * lr)", update / max_norm, "< 1e-3")],
    )


def _near_converged_mlp():
    """A 2-layer MLP whose output is small, so the loss gradients are tiny (as late in training)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    with torch.no_grad():
        model[2].weight.mul_(0.01)
        model[2].bias.zero_()
    return model


def _small_targets() -> tuple[torch.Tensor, torch.Tensor]:
    """A batch whose targets are tiny, so near _near_converged_mlp's outputs: X (1024, 32), y (1024, 1)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1024, 32, generator=g)                 # (1024, 32)
    y = 1e-4 * (X @ torch.randn(32, 1, generator=g))       # (1024, 1): small targets
    return X, y


def _zeroed_gradient_entries(model: nn.Module, reference: nn.Module) -> tuple[int, int]:
    """(entries of model's .grad that are 0 where reference's are not, entries non-zero in reference)."""
    pairs = [(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters())]
    nonzero = sum((q != 0).sum().item() for _, q in pairs)
    zeroed = sum(((p == 0) & (q != 0)).sum().item() for p, q in pairs)
    return zeroed, nonzero


@pitfall(
    id="fp16-without-scaler", chapter=6,
    title="float16 autocast without a GradScaler: small gradients underflow to zero",
    symptom="more than half of the gradient entries that are non-zero in float32 are exactly 0, and the "
            "first layer's gradient norm is below 1% of the float32 one",
    why="""float16's smallest positive (subnormal) number is about 6e-8 and its largest 65504. In
    backward, the gradients flowing through float16 ops are float16 too; when the loss gradient is
    small (late in training, a mean over a large batch) they round to 0 and the layers before receive
    nothing. The GradScaler multiplies the loss by 65536 before backward, so those gradients stay
    representable, then divides the fp32 parameter gradients by the same factor before the step.""",
    catch="""Use `torch.amp.GradScaler(device)` with float16 autocast (bfloat16 has float32's range and
    does not need one). Count the exact zeros in the gradients: a layer whose gradient is all 0 is the sign.""",
)
def fp16_without_scaler(buggy: bool) -> Outcome:
    X, y = _small_targets()                                # (1024, 32), (1024, 1)
    reference = _near_converged_mlp()
    nn.functional.mse_loss(reference(X), y).backward()     # the float32 gradients
    model = _near_converged_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if buggy:
        scaler = torch.amp.GradScaler("cpu", enabled=False)  # BUG: no scaling: small grads round to 0
    else:
        scaler = torch.amp.GradScaler("cpu")               # FIX: loss x 65536 before backward, / 65536 after
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(X)                                     # (1024, 1) float16
    scaler.scale(nn.functional.mse_loss(out.float(), y)).backward()
    scaler.unscale_(opt)
    zeroed, nonzero = _zeroed_gradient_entries(model, reference)
    first = (model[0].weight.grad.norm() / reference[0].weight.grad.norm()).item()
    return Outcome(
        figures={"gradient entries non-zero in float32": nonzero, "of those, 0 here": float(zeroed),
                 "first layer grad norm / float32's": first},
        checks=[Check("fraction of gradient entries zeroed", zeroed / nonzero, "> 0.5"),
                Check("first layer grad norm / float32's", first, "< 0.01")],
    )


_RERUN_SCRIPT = """
import pickle, sys
sys.path.insert(0, {root!r})                 # before the working directory `-c` puts first
import torch
if torch.cuda.is_available():
    sys.exit("CUDA_VISIBLE_DEVICES='' did not hide CUDA from torch")
from {module} import {name} as reproduce
with open(sys.argv[1], "wb") as out:
    pickle.dump(reproduce(buggy={buggy}), out)
"""


def _rerun_without_cuda(reproduce, buggy: bool) -> Outcome:
    """reproduce(buggy) run in a fresh Python whose torch sees no CUDA device, as on a CPU-only machine."""
    env = {**env_importing_this_ptlab(), "CUDA_VISIBLE_DEVICES": ""}
    code = _RERUN_SCRIPT.format(root=PTLAB_ROOT, module=reproduce.__module__, name=reproduce.__name__,
                                buggy=bool(buggy))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "outcome.pickle"
        run = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True,
                             timeout=300)
        if run.returncode != 0:
            raise RuntimeError(f"rerunning {reproduce.__name__} without CUDA failed (exit code {run.returncode}):\n"
                               f"{run.stderr[-2000:]}")
        with path.open("rb") as f:
            return pickle.load(f)


DISABLED_WARNING = "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling."


@pitfall(
    id="gradscaler-default-device", chapter=6,
    title="torch.amp.GradScaler() without a device means 'cuda': where torch finds no CUDA it switches itself off",
    symptom="without CUDA the scaler is disabled (is_enabled() False, a UserWarning ending 'CUDA is not available.  "
            "Disabling.'), scale(loss) leaves the loss unscaled, and more than half of the gradient entries that "
            "are non-zero in float32 come out exactly 0",
    why="""The device type is `GradScaler`'s first argument and defaults to "cuda". Where torch finds no CUDA (and
    torch_xla is not installed), the constructor warns "torch.cuda.amp.GradScaler is enabled, but CUDA is not
    available.  Disabling." (a UserWarning that names the old class even when you called `torch.amp.GradScaler`) and
    turns the scaler off: `scale(loss)` returns `loss` itself, `unscale_()` and `update()` do nothing, and `step()`
    is a plain `optimizer.step()`. Training runs on without an error and without loss scaling, so the small float16
    gradients round to 0, as in the fp16-without-scaler pitfall. On a machine with CUDA the same line makes an
    enabled scaler, and by torch 2.14's source (read, not run here: this course runs on the CPU) it scales a CPU
    loss correctly too, because it makes its scale tensor on the device of the first tensor it scales. So the bug
    stays hidden where torch sees CUDA (an NVIDIA or ROCm GPU) and shows everywhere else: a CPU-only laptop or
    CI runner, an Apple-silicon Mac, an Intel GPU. This reproduction needs that
    condition: where torch sees CUDA, it reruns itself in a child Python started with `CUDA_VISIBLE_DEVICES=""`,
    in which torch sees none (the figure "CUDA available where it ran" says so).""",
    catch="""Pass the device you train on: `torch.amp.GradScaler("cpu")`, or `torch.amp.GradScaler(device.type)`
    with `device` chosen once at the top. Assert `scaler.is_enabled()` after making it, and run your tests with
    warnings turned into errors (pytest's `-W error`) so the "Disabling." warning fails them.""",
)
def gradscaler_default_device(buggy: bool) -> Outcome:
    if torch.cuda.is_available():                          # the bug needs a machine without CUDA:
        return _rerun_without_cuda(gradscaler_default_device, buggy)  # rerun in a process that sees none
    X, y = _small_targets()                                # (1024, 32), (1024, 1): small targets
    reference = _near_converged_mlp()
    nn.functional.mse_loss(reference(X), y).backward()     # the float32 gradients
    model = _near_converged_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:   # the warning stays here, never on stderr
        warnings.simplefilter("always")
        if buggy:
            scaler = torch.amp.GradScaler()                # BUG: device defaults to "cuda"; no CUDA: disabled
        else:
            scaler = torch.amp.GradScaler("cpu")           # FIX: the device you train on
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(X)                                     # (1024, 1) float16
    loss = nn.functional.mse_loss(out.float(), y)
    scaled = scaler.scale(loss)                            # disabled: returns loss itself
    scaled.backward()
    scaler.step(opt)                                       # unscales .grad first; disabled: a plain opt.step()
    scaler.update()
    zeroed, nonzero = _zeroed_gradient_entries(model, reference)
    warned = [f"{w.category.__name__}: {w.message}" for w in caught]
    return OutcomeWithTexts(
        figures={"CUDA available where it ran": torch.cuda.is_available(), "scaler._device": scaler._device,
                 "is_enabled()": scaler.is_enabled(), "warnings": len(warned), "scaled loss / loss":
                 (scaled / loss).item(), "gradient entries non-zero in float32": nonzero,
                 "of those, 0 here": float(zeroed)},
        checks=[Check("scaler.is_enabled()", scaler.is_enabled(), "is False"),
                Check("a UserWarning said 'CUDA is not available.  Disabling.'",
                      f"UserWarning: {DISABLED_WARNING}" in warned, "is True"),
                Check("scaled loss / loss", (scaled / loss).item(), "< 2"),
                Check("fraction of gradient entries zeroed", zeroed / nonzero, "> 0.5")],
        texts={"warnings": "\n".join(warned) or "none"},
    )


@pitfall(
    id="deprecated-amp-spelling", chapter=6,
    title="torch.cpu.amp / torch.cuda.amp spellings are deprecated and warn",
    symptom="torch.cpu.amp.autocast and torch.cpu.amp.GradScaler each raise a deprecation warning naming "
            "the torch.amp replacement",
    why="""Since torch 2.4 the device-specific modules are thin wrappers that warn: the one API is
    `torch.amp.autocast(device_type, dtype=...)` and `torch.amp.GradScaler(device_type)`, the same
    code for CPU and CUDA with the device as an argument. (`torch.cuda.amp.*` warns the same way.)""",
    catch="""Replace `torch.cuda.amp.autocast()` with `torch.amp.autocast("cuda")`, `torch.cpu.amp.autocast()`
    with `torch.amp.autocast("cpu")`, and `torch.cuda.amp.GradScaler()` with `torch.amp.GradScaler("cuda")`.
    Run the tests with deprecation warnings turned into errors (pytest's `-W error`) to find the rest.""",
)
def deprecated_amp_spelling(buggy: bool) -> Outcome:
    model = nn.Linear(8, 1)
    X, _ = _batch()
    with warnings.catch_warnings(record=True) as caught:   # the warnings stay here, never on stderr
        warnings.simplefilter("always")
        if buggy:
            scaler = torch.cpu.amp.GradScaler()            # BUG: deprecated spelling
            with torch.cpu.amp.autocast(dtype=torch.bfloat16):  # BUG: deprecated spelling
                out = model(X)
        else:
            scaler = torch.amp.GradScaler("cpu")           # FIX: torch.amp with the device type
            with torch.amp.autocast("cpu", dtype=torch.bfloat16):  # FIX: same API for cpu and cuda
                out = model(X)
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    named = re.findall(r"Please use `(torch\.amp\.\w+)\('(\w+)'", " ".join(future))   # [(name, device), ...]
    return OutcomeWithTexts(
        figures={"deprecation warnings": len(future),
                 "replacements they name": ", ".join(f"{name}('{device}')" for name, device in named) or "none",
                 "output dtype": str(out.dtype), "scaler enabled": scaler.is_enabled()},
        checks=[Check("deprecation warnings raised", len(future), "== 2"),
                Check("a warning names torch.amp.autocast('cpu') as the replacement",
                      ("torch.amp.autocast", "cpu") in named, "is True")],
        texts={"warnings": "\n".join(future) or "none"},
    )


@pitfall(
    id="manual-half-vs-autocast", chapter=6,
    title="model.half() instead of autocast: the loss is float16 and small updates are rounded away",
    symptom="the loss is torch.float16, and more than half of the weights whose gradient is non-zero are "
            "unchanged after an SGD step",
    why="""`.half()` converts every parameter and buffer (BatchNorm's running statistics too) to float16,
    so the loss and the optimizer's arithmetic are float16 as well. float16 has 10 stored mantissa bits:
    next to a weight of 0.1 its values are 6.1e-5 apart, so an update `lr * grad` smaller than half of
    that (about 3e-5) rounds back to 0.1 and the weight never moves. autocast keeps float32 parameters
    (master weights) and casts per op: matmuls and convolutions run in low precision and the losses in
    float32; on the CPU, BatchNorm's output stays low precision too, while its statistics stay float32.""",
    catch="""Keep the model in float32 and wrap the forward pass in `torch.amp.autocast(device, dtype)`.
    Check `next(model.parameters()).dtype` is float32 and `loss.dtype` is float32.""",
)
def manual_half_vs_autocast(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 16, generator=g)                   # (64, 16)
    y = torch.randint(0, 4, (64,), generator=g)            # (64,)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    if buggy:
        model = model.half()                               # BUG: parameters, buffers and loss in float16
        X = X.half()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    with torch.autocast("cpu", dtype=torch.float16, enabled=not buggy):  # FIX: float32 weights, autocast
        loss = nn.functional.cross_entropy(model(X), y)
    loss.backward()
    weight = model[0].weight
    before = weight.detach().clone()
    opt.step()
    moving = weight.grad != 0
    unchanged = ((weight.detach() == before) & moving).sum().item() / moving.sum().item()
    return Outcome(
        figures={"loss dtype": str(loss.dtype), "parameter dtype": str(weight.dtype),
                 "fraction of weights with non-zero grad left unchanged": unchanged},
        checks=[Check("the loss is float16", loss.dtype == torch.float16, "is True"),
                Check("fraction of weights with non-zero grad left unchanged", unchanged, "> 0.5")],
    )


def _exact_if_not_finite(value: float) -> float | str:
    """inf and nan as exact text (they are the same on every machine); a finite value stays a measured float."""
    return value if math.isfinite(value) else str(value)


@pitfall(
    id="fp16-forward-overflow", chapter=6,
    title="A forward value past float16's range (largest 65504) becomes inf: the loss is NaN",
    symptom="under float16 autocast the largest similarity score is inf and the loss is not finite (NaN); "
            "computed in float32, the same scores and the loss are finite",
    why="""autocast runs matmuls in float16, and float16's largest finite value is 65504: a result of 65520 or
    more rounds to inf. Here the features are not normalized, so the encoded queries and documents have entries around
    40, and a query's score with its own document sums 128 products of about 40 x 40, some 2e5. `cross_entropy`
    runs in float32 under autocast, but the inf is already in its input, and the log-softmax of a row holding
    +inf computes inf - inf = NaN. A GradScaler does not help: it scales the backward pass, not the forward. The
    same holds for any float16 value that reaches 65520: a large logit; and on the CPU, whose autocast leaves
    exp, pow and sum in their input's dtype, also a sum of squares of a float16 activation or an exp of more
    than about 11.1 (CUDA's autocast runs those three in float32). Switching autocast off is not enough on its own:
    `q` and `d`
    are already float16, and a matmul of float16 tensors outside autocast is float16 too, so the fix casts them.""",
    catch="""Run the region that makes large values in float32: `with torch.autocast(device_type, enabled=False):`
    and cast its inputs with `.float()`; or autocast to bfloat16, which has float32's range; or keep the values
    small (normalize the embeddings, divide attention scores by sqrt(d)). Check `torch.isfinite(loss)` every
    step and log the largest absolute value of a suspect activation.""",
)
def fp16_forward_overflow(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    docs = 70 * torch.randn(64, 128, generator=g)          # (64, 128): raw features, not normalized
    queries = docs + 10 * torch.randn(64, 128, generator=g)  # (64, 128): query i is about document i
    torch.manual_seed(0)
    encode = nn.Linear(128, 128)
    with torch.autocast("cpu", dtype=torch.float16):
        q, d = encode(queries), encode(docs)               # (64, 128) float16 each, entries around 40
        if buggy:
            scores = q @ d.T                               # BUG: float16 matmul: scores of 65520 or more are inf
        else:
            with torch.autocast("cpu", enabled=False):     # FIX: this region in float32...
                scores = q.float() @ d.float().T           # FIX: ...on float32 inputs (q and d are float16)
        loss = nn.functional.cross_entropy(scores, torch.arange(64))  # (64, 64) scores -> float32 loss
    largest = scores.abs().max().item()
    with torch.no_grad():
        in_float32 = (encode(queries) @ encode(docs).T).abs().max().item()   # no autocast: all float32
    return Outcome(
        figures={"scores dtype": str(scores.dtype), "largest |score|": _exact_if_not_finite(largest),
                 "largest |score| computed in float32": in_float32, "loss": _exact_if_not_finite(loss.item())},
        checks=[Check("the largest |score| is inf", math.isinf(largest), "is True"),
                Check("the loss is finite", math.isfinite(loss.item()), "is False")],
    )


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
    why="""`scaler.step(optimizer)` does not call `optimizer.step()` when the gradients hold an inf or NaN, and the
    scale starts high (65536), so the first steps of a float16 run are often skipped while `update()` halves it
    (torch's `GradScaler` documentation says as much). A scheduler stepped every iteration does not know: it moves
    on, and the learning rates it meant for
    those steps are used by no update. Here a 3-step warm-up (0.025 to 0.1) is spent entirely on the 3 skipped
    steps. torch notices only one case: when the scheduler's first `step()` comes before any `optimizer.step()` since
    the scheduler was made,
    it warns that the two were called in the wrong order (the code did call them in the right order). Skips after
    the first real step pass without a word. (Advice, not measured here: a few skips in a long schedule change
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
