"""Chapter 5 exercises: clean a DDP checkpoint's keys, and accumulate gradients exactly."""
from __future__ import annotations

import copy

import torch
from torch import nn

from ptlab.course.exercises import NotAttempted, Wrong, calls_stub, exercise, is_untouched_stub


@exercise(
    id="ch5-strip-module-prefix", chapter=5,
    task="write clean_state_dict(state): the same tensors with a leading 'module.' removed from every key "
         "that starts with it, every other key unchanged",
    hint="DDP adds its prefix at the very start of a key and nowhere else: a key like 'submodule.weight' or "
         "'head.module.bias' must come out as it went in",
)
def check_strip_module_prefix(clean_state_dict) -> None:
    w, b, s = torch.ones(2), torch.zeros(2), torch.full((1,), 3.0)
    state = {"module.encoder.weight": w, "module.head.module.bias": b, "submodule.scale": s}
    expected = {"encoder.weight": w, "head.module.bias": b, "submodule.scale": s}
    given = dict(state)
    try:
        cleaned = calls_stub(clean_state_dict, given)
    except Wrong:
        if sorted(given) == sorted(expected):   # cleaned in place, as consume_prefix_in_state_dict_if_present does
            raise Wrong("your function cleaned the dict it was given in place and returned None "
                        "(torch's consume_prefix_in_state_dict_if_present works in place): return the dict") from None
        raise
    if not isinstance(cleaned, dict):
        raise Wrong(f"return a dict of key -> tensor, got {type(cleaned).__name__}")
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


def _stale_gradient(model):
    """The gradient left over from earlier work that a correct step must not use."""
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.1)


_LR, _K = 0.5, 4


def _gradient(model, X, y, scale=1.0):
    """d(scale * mean cross-entropy)/d(parameters), without touching .grad."""
    return torch.autograd.grad(nn.functional.cross_entropy(model(X), y) * scale, list(model.parameters()))


def _weights_after_mistake(mistake: str) -> list[torch.Tensor]:
    """The weights a typical wrong step would leave, computed from gradients (not by running the wrong code)."""
    model, X, y = _accumulation_problem()
    micro = [(X[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]
    if mistake == "step-in-loop":                     # one SGD step per micro-batch, on the gradients so far
        total = [torch.zeros_like(p) for p in model.parameters()]
        for X_i, y_i in micro:
            total = [t + g for t, g in zip(total, _gradient(model, X_i, y_i, 1 / _K))]
            with torch.no_grad():
                for p, t in zip(model.parameters(), total):
                    p -= _LR * t
        return [p.detach() for p in model.parameters()]
    gradient = {"no-scaling": lambda: _gradient(model, X, y, _K),               # K means summed, not averaged
                "stale": lambda: [g + 0.1 for g in _gradient(model, X, y)],     # the old 0.1 added
                "zero-in-loop": lambda: _gradient(model, *micro[-1], 1 / _K),   # the last micro-batch only
                }[mistake]()
    return [(p - _LR * g).detach() for p, g in zip(model.parameters(), gradient)]


_MISTAKES = (
    ("no-scaling", "each micro-batch's loss counts in full, so the step is K = 4 times too large: "
                   "divide each micro-batch's loss by K"),
    ("stale", "the step used the gradient left over from earlier work: zero the gradients once, before the loop"),
    ("zero-in-loop", "only the last micro-batch's gradient reached the step: zeroing inside the loop throws "
                     "the others away; zero once, before the loop"),
    ("step-in-loop", "that is K optimizer steps, one per micro-batch: step once, after the loop"),
)


class _GraphsAlive:
    """Counts, while active, the most forwards of `model` run before a backward reached its weights, and the
    most rows one forward saw: how much of a batch's activations an answer kept alive at once."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.live, self.most_forwards_before_backward, self.largest_input = model, 0, 0, 0

    def _forward(self, module, args) -> None:
        self.live += 1
        self.most_forwards_before_backward = max(self.most_forwards_before_backward, self.live)
        self.largest_input = max([self.largest_input] + [a.shape[0] for a in args if isinstance(a, torch.Tensor)])

    def _backward(self, grad: torch.Tensor) -> None:
        self.live = 0

    def __enter__(self) -> _GraphsAlive:
        first = next(self.model.parameters())
        self.handles = [self.model.register_forward_pre_hook(self._forward), first.register_hook(self._backward)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()


@exercise(
    id="ch5-accumulate-gradients", chapter=5,
    task="write accumulated_step(model, optimizer, micro_batches): one optimizer step from K micro-batches "
         "of equal size that equals one step on the whole batch (mean cross-entropy), and return nothing",
    hint="the whole batch's mean loss is the mean of the K micro-batch means; gradients add up across "
         "backward calls until you zero them; and the step should happen once",
)
def check_accumulate_gradients(accumulated_step) -> None:
    if is_untouched_stub(accumulated_step):
        raise NotAttempted
    model, X, y = _accumulation_problem()
    reference = copy.deepcopy(model)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=_LR)
    opt_ref.zero_grad()
    nn.functional.cross_entropy(reference(X), y).backward()
    opt_ref.step()
    opt = torch.optim.SGD(model.parameters(), lr=_LR)
    _stale_gradient(model)                                # a stale gradient from earlier work: the step must not use it
    micro = [(X[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]
    with _GraphsAlive(model) as alive:
        result = accumulated_step(model, opt, micro)
    if result is Ellipsis:
        raise NotAttempted
    before = dict(_accumulation_problem()[0].named_parameters())
    moved = max((p - before[n]).abs().max().item() for n, p in model.named_parameters())
    if moved == 0:
        raise Wrong("the weights did not change: call optimizer.step() once, after the micro-batches")
    error = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
    rows, size = sum(len(X) for X, _ in micro), len(micro[0][0])
    if error <= 1e-6 and alive.largest_input > size:
        raise Wrong(f"model(X) ran on {alive.largest_input} of the batch's {rows} rows at once: "
                    f"{alive.largest_input / size:g} micro-batches' activations alive together, where one was the "
                    "limit. Run the model on one micro-batch at a time.")
    if error <= 1e-6 and alive.most_forwards_before_backward > 1:
        raise Wrong(f"{alive.most_forwards_before_backward} forward passes (of {len(micro)}) ran before a backward: "
                    "their graphs and saved activations were alive together, where one was the limit. Call "
                    "backward() on each micro-batch's loss before the next forward.")
    if error > 1e-6:
        mine = [p.detach() for p in model.parameters()]
        for mistake, advice in _MISTAKES:
            if all(torch.allclose(a, b, atol=1e-6) for a, b in zip(mine, _weights_after_mistake(mistake))):
                raise Wrong(f"your step differs from the whole-batch step: {advice}")
        expected = max((p - before[n]).abs().max().item() for n, p in reference.named_parameters())
        raise Wrong(f"your step differs from the whole-batch step (it moved the weights {moved / expected:.1f}x as "
                    "far): compare your loop with the hint")
