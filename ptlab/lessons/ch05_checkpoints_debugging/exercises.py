"""Chapter 5 exercises: clean a DDP checkpoint's keys, and accumulate gradients exactly."""
from __future__ import annotations

import copy

import torch
from torch import nn

from ptlab.course.exercises import NotAttempted, Wrong, calls_stub, exercise


@exercise(
    id="ch5-strip-module-prefix", chapter=5,
    task="write clean_state_dict(state): the same tensors with a leading 'module.' removed from every key "
         "that starts with it, every other key unchanged",
    hint="the prefix is only at the start of a key: test key.startswith('module.') and slice it off; "
         "a key like 'submodule.weight' or 'head.module.bias' must stay as it is",
)
def check_strip_module_prefix(clean_state_dict) -> None:
    w, b, s = torch.ones(2), torch.zeros(2), torch.full((1,), 3.0)
    state = {"module.encoder.weight": w, "module.head.module.bias": b, "submodule.scale": s}
    cleaned = calls_stub(clean_state_dict, dict(state))
    if not isinstance(cleaned, dict):
        raise Wrong(f"return a dict of key -> tensor, got {type(cleaned).__name__}")
    expected = {"encoder.weight": w, "head.module.bias": b, "submodule.scale": s}
    if sorted(cleaned) != sorted(expected):
        raise Wrong(f"for keys {sorted(state)} you return {sorted(cleaned)}; expected {sorted(expected)}")
    if not all(cleaned[k] is v or torch.equal(cleaned[k], v) for k, v in expected.items()):
        raise Wrong("the keys are right but a tensor changed: keep each value as it was")


def _accumulation_problem():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    return model, X, y


@exercise(
    id="ch5-accumulate-gradients", chapter=5,
    task="write accumulated_step(model, optimizer, micro_batches): one optimizer step from K micro-batches "
         "that equals one step on the whole batch (mean cross-entropy), and return nothing",
    hint="zero the gradients once, before the loop; backward each micro-batch's loss scaled so that K of "
         "them add up to the whole batch's mean; step once, after the loop",
)
def check_accumulate_gradients(accumulated_step) -> None:
    model, X, y = _accumulation_problem()
    reference = copy.deepcopy(model)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.5)
    opt_ref.zero_grad()
    nn.functional.cross_entropy(reference(X), y).backward()
    opt_ref.step()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for p in model.parameters():  # a stale gradient from earlier work: the step must not use it
        p.grad = torch.full_like(p, 0.1)
    micro = [(X[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]
    result = accumulated_step(model, opt, micro)
    if result is Ellipsis:
        raise NotAttempted
    before = dict(_accumulation_problem()[0].named_parameters())
    moved = max((p - before[n]).abs().max().item() for n, p in model.named_parameters())
    if moved == 0:
        raise Wrong("the weights did not change: call optimizer.step() once, after the micro-batches")
    error = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
    if error > 1e-6:
        expected = max((p - before[n]).abs().max().item() for n, p in reference.named_parameters())
        ratio = moved / expected
        cause = ("that is about K = 4 times: divide each micro-batch's loss by K" if 3.5 < ratio < 4.5
                 else "look for a stale gradient (zero_grad before the loop) or more than one optimizer step")
        raise Wrong(f"your step differs from the whole-batch step: it moved the weights {ratio:.1f}x as far; "
                    f"{cause}")
