"""Chapter 6 pitfalls about dtypes: a model cast wholly to float16 or bfloat16, and a forward past float16's range.

The GradScaler pitfalls are in pitfalls.py, the scheduler and checkpoint ones in pitfalls_resume.py.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall


@pitfall(
    id="manual-half-vs-autocast", chapter=6,
    title="model.half() instead of autocast: the loss is float16 and small updates are rounded away",
    symptom="the loss is torch.float16, and more than half of the weights whose gradient is non-zero are "
            "unchanged after an SGD step",
    why="""`.half()` converts every floating-point parameter and buffer (BatchNorm's running statistics too;
    its integer `num_batches_tracked` stays int64) to float16,
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
        checks=[Check("fraction of weights with non-zero grad left unchanged", unchanged, "> 0.5")],
    )


def _regression(n: int = 256, features: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A noiseless linear regression batch: X (n, features), y (n, 1)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, features, generator=g)              # (n, F)
    return X, X @ torch.randn(features, 1, generator=g)    # (n, 1)


@pitfall(
    id="bf16-weights", chapter=6,
    title="A model cast wholly to bfloat16 stops learning once its updates are smaller than the weights' spacing",
    symptom="after 300 SGD steps the loss of the bfloat16 model is more than 10x that of float32 weights "
            "trained under bfloat16 autocast, and at the last step more than half of its weights did not move",
    why="""`model.to(torch.bfloat16)` makes the weights, their gradients and the optimizer's arithmetic bfloat16.
    bfloat16 keeps float32's range, so nothing overflows and no scaler is needed, but it has 8 significant bits:
    next to a weight of 0.1 its values are about 4.9e-4 apart (float16's are 6.1e-5 apart). An update `lr * grad`
    smaller than half that spacing rounds back to the old weight. Early in training the updates are large and the
    loss falls; as the gradients shrink, more and more updates round away and the loss stalls far above what the
    same recipe reaches with float32 weights. autocast keeps float32 weights (the master copy) and runs only the
    matmuls in bfloat16, so the small updates add up.""",
    catch="""Keep the parameters and the optimizer state in float32 and use `torch.amp.autocast(device, dtype=
    torch.bfloat16)` for the forward pass. Where memory forces bfloat16 weights, use an optimizer that keeps a
    float32 copy or compensates the rounding (Kahan summation, stochastic rounding; advice, not run here). Check
    `next(model.parameters()).dtype`, and log the fraction of weights an optimizer step left unchanged.""",
)
def bf16_weights(buggy: bool) -> Outcome:
    X, y = _regression()                                   # (256, 16), (256, 1)
    torch.manual_seed(0)
    reference_loss, _ = _sgd_steps(nn.Linear(16, 1), X, y, autocast=True)   # float32 weights under autocast
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    if buggy:
        model = model.to(torch.bfloat16)                   # BUG: weights, grads and updates in bfloat16
    loss, unchanged = _sgd_steps(model, X, y, autocast=not buggy)  # FIX: float32 weights, bfloat16 autocast
    return Outcome(
        figures={"parameter dtype": str(model.weight.dtype), "loss after 300 steps": loss,
                 "same with float32 weights under autocast": reference_loss,
                 "fraction of weights with non-zero grad unchanged by the last step": unchanged},
        checks=[Check("loss after 300 steps / float32 weights' under autocast", loss / reference_loss, "> 10"),
                Check("fraction of weights with non-zero grad unchanged by the last step", unchanged, "> 0.5")],
    )


def _sgd_steps(model: nn.Module, X: torch.Tensor, y: torch.Tensor, autocast: bool, steps: int = 300,
               lr: float = 0.05) -> tuple[float, float]:
    """SGD on the MSE: (the last loss, the fraction of weights with a non-zero grad the last step left unchanged)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(X.to(next(model.parameters()).dtype))   # (n, 1) bfloat16 either way
        loss = nn.functional.mse_loss(out.float(), y)
        loss.backward()
        before = model.weight.detach().clone()
        opt.step()
    moving = model.weight.grad != 0
    unchanged = ((model.weight.detach() == before) & moving).sum().item() / moving.sum().item()
    return loss.item(), unchanged


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
