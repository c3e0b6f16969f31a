"""Chapter 6 exercises: one correct AMP training step, and a bf16 sum with a float32 accumulator."""
from __future__ import annotations

import torch
from torch import nn

from ptlab.course.exercises import Wrong, calls_stub, exercise


def _problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = 5 * torch.randn(64, 8, generator=g)                # (64, 8): large gradients, so clipping acts
    y = X @ torch.randn(8, 1, generator=g)                 # (64, 1)
    torch.manual_seed(seed)
    return nn.Linear(8, 1), X, y


def _reference_step(model, opt, scaler, X, y, max_norm):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(X).float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    return loss


@exercise(
    id="ch6-amp-step", chapter=6,
    task="write amp_step(model, opt, scaler, X, y, max_norm): one training step with bf16 autocast on the CPU, "
         "the GradScaler, and gradient clipping at max_norm; return the loss",
    hint="zero_grad; forward and MSE loss under torch.amp.autocast('cpu', dtype=torch.bfloat16); "
         "scaler.scale(loss).backward(); scaler.unscale_(opt) BEFORE clip_grad_norm_; scaler.step(opt); "
         "scaler.update()",
)
def check_amp_step(amp_step) -> None:
    model, X, y = _problem()
    reference, _, _ = _problem()
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", growth_interval=1)
    ref_scaler = torch.amp.GradScaler("cpu", growth_interval=1)
    for step in range(3):
        try:
            loss = calls_stub(amp_step, model, opt, scaler, X, y, 1.0)
        except (RuntimeError, AssertionError) as err:
            if "update" in str(err):
                raise Wrong(f"step {step + 1} raised {type(err).__name__}: {err} Check the order of "
                            "scaler.step() and scaler.update(), and that update() runs every step.") from None
            raise
        _reference_step(reference, ref_opt, ref_scaler, X, y, 1.0)
        if not isinstance(loss, torch.Tensor):
            raise Wrong(f"return the loss tensor, not {type(loss).__name__}.")
    if scaler.get_scale() != ref_scaler.get_scale():
        raise Wrong(f"after 3 steps the scale is {scaler.get_scale()}, expected {ref_scaler.get_scale()}: "
                    "is scaler.update() called once per step?")
    for p, q in zip(model.parameters(), reference.parameters()):
        if not torch.allclose(p, q, rtol=1e-3, atol=1e-5):
            moved = (p.detach() - q.detach()).abs().max().item()
            raise Wrong(f"the weights differ from a correct step's by up to {moved:.3g}: clip after "
                        "scaler.unscale_(opt), under bf16 autocast, with zero_grad first.")


@exercise(
    id="ch6-fp32-accumulator", chapter=6,
    task="write stable_sum(values): the sum of a bfloat16 tensor, returned as a float32 tensor accurate to 1e-3",
    hint="bfloat16 keeps 8 significant bits: at 1000 its spacing is 8. Convert to float32 before adding "
         "(or pass dtype=torch.float32 to sum) so the total is kept in float32",
)
def check_fp32_accumulator(stable_sum) -> None:
    g = torch.Generator().manual_seed(0)
    values = (torch.rand(4096, generator=g) * 0.5).to(torch.bfloat16)   # sum about 1000
    total = calls_stub(stable_sum, values)
    if not isinstance(total, torch.Tensor):
        raise Wrong(f"return a tensor, not {type(total).__name__}.")
    if total.dtype != torch.float32:
        raise Wrong(f"the result is {total.dtype}: a bfloat16 total near 1000 can only be a multiple of 8.")
    expected = values.double().sum().item()
    if abs(total.item() - expected) > 1e-3 * abs(expected):
        raise Wrong(f"the sum is {total.item():.4f}, expected {expected:.4f}.")
