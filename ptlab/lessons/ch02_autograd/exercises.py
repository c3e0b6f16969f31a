"""Chapter 2 exercises: find a layer that does not train and fix it, keep a loss term in the graph, clip a step."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ptlab.course.exercises import NotAttempted, Wrong, answer_digest, calls_stub, exercise
from ptlab.lessons.ch02_autograd.exercise_figures import FIGURES


def hard_gate(logits: torch.Tensor) -> torch.Tensor:
    """1 where a unit is open (its gate logit is positive), 0 where it is shut."""
    return (logits > 0).float()


class GatedRegressor(nn.Module):
    """A small model with a gate; one of its layers never trains (the exercise is to find which, and why)."""

    def __init__(self, gate_fn: Callable[[torch.Tensor], torch.Tensor] = hard_gate) -> None:
        super().__init__()
        self.features = nn.Linear(4, 8)
        self.gate = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)
        self.gate_fn = gate_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.features(x))                   # (B, 8)
        open_units = self.gate_fn(self.gate(x))            # (B, 8): how far each unit is open, 0 to 1
        return self.head(h * open_units)                   # (B, 1)


def gated_model_and_batch(seed: int = 0, gate_fn: Callable[[torch.Tensor], torch.Tensor] = hard_gate
                          ) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The exercise's model (with `hard_gate`, or the gate function you pass) and one batch
    (X (32, 4), y (32, 1)), seeded."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(32, 4, generator=g)
    return GatedRegressor(gate_fn), (X, X.sum(dim=1, keepdim=True))


@exercise(
    id="ch2-why-no-training", chapter=2,
    task="find which layer of gated_model_and_batch()'s model never trains, and write soft_gate(logits), "
         "a replacement for hard_gate that also goes from 0 (shut) to 1 (open) but lets that layer train: "
         "answer (module name, soft_gate)",
    hint="read forward and hard_gate, and ask of each op between a layer and the loss: does its result change "
         "when that layer's weights change a little? Where it cannot, no usable gradient reaches the layer",
)
def check_why_no_training(answer) -> None:
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and isinstance(answer[0], str)):
        raise Wrong("answer with a module name and a function, e.g. ('features', soft_gate).")
    module, soft_gate = answer
    if soft_gate is Ellipsis:
        raise NotAttempted
    modules = [name for name, _ in GatedRegressor().named_children()]
    if module not in modules:
        raise Wrong(f"{module!r} is not a layer of the model; its layers are {', '.join(modules)}.")
    if answer_digest(module) != FIGURES["ch2-why-no-training"]["layer"]:
        raise Wrong(f"{module!r} does get a gradient: follow each layer's output to the loss, and find the "
                    "one that passes through an op whose result is not a float.")
    logits = torch.linspace(-10.0, 10.0, 41, requires_grad=True)
    opened = calls_stub(soft_gate, logits)
    if not isinstance(opened, torch.Tensor) or opened.shape != logits.shape or not opened.is_floating_point():
        raise Wrong("soft_gate(logits) should return a float tensor of the logits' shape.")
    low, high = opened.min().item(), opened.max().item()
    if low < 0 or high > 1:
        raise Wrong(f"a gate opens from 0 (shut) to 1 (open); yours gave values from {low:.3g} to {high:.3g}.")
    if opened[0].item() > 0.1 or opened[-1].item() < 0.9:
        raise Wrong(f"like hard_gate, it should be shut (near 0) at logit -10 and open (near 1) at +10; "
                    f"yours gives {opened[0].item():.3g} and {opened[-1].item():.3g}.")
    grad = torch.autograd.grad(opened.sum(), logits, allow_unused=True)[0] if opened.requires_grad else None
    if grad is None:
        raise Wrong("no gradient reaches the logits through your function: what does a comparison return, "
                    "and what did .float() or detach() keep of the graph?")
    if not bool((grad != 0).any()):
        raise Wrong("a gradient reaches the logits, but it is 0 everywhere: the gate layer still cannot learn.")
    model, (X, y) = gated_model_and_batch(gate_fn=soft_gate)
    nn.functional.mse_loss(model(X), y).backward()
    gate_grad = model.gate.weight.grad
    if gate_grad is None or not bool(torch.isfinite(gate_grad).all()) or not bool((gate_grad != 0).any()):
        raise Wrong("with your function in the model, the gate layer still gets no usable gradient.")


def _penalty_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))


@exercise(
    id="ch2-penalty-in-graph", chapter=2,
    task="write weight_penalty(model) returning the sum of the squared values of every parameter (weights and "
         "biases alike) as a tensor that stays in the graph",
    hint="a Python number (from .item(), float() or torch.tensor(...)) carries no graph; combine the "
         "parameters with tensor operations only, and keep every partial result a tensor",
)
def check_penalty_in_graph(weight_penalty) -> None:
    model = _penalty_model()
    penalty = calls_stub(weight_penalty, model)
    if not isinstance(penalty, torch.Tensor):
        raise Wrong(f"return a tensor, not {type(penalty).__name__}: a Python number has no graph.")
    _refuse_a_graph_that_misses_parameters(penalty, model)
    expected = torch.tensor(FIGURES["ch2-penalty-in-graph"]["penalty"])
    if penalty.numel() != 1 or not torch.allclose(penalty.detach().reshape(()), expected):
        shown = ", ".join(f"{v:.4f}" for v in penalty.detach().flatten()[:3].tolist())
        raise Wrong(f"the value is {shown}, expected {expected.item():.4f}.")
    if not penalty.requires_grad:
        raise Wrong("the value is right but it has no grad_fn: the penalty cannot train anything.")
    grads = torch.autograd.grad(penalty.reshape(()), list(model.parameters()), allow_unused=True)
    if any(g is None or not torch.allclose(g, 2 * p.detach()) for g, p in zip(grads, model.parameters())):
        raise Wrong("the value is right, but the gradient of sum(w^2) with respect to each parameter w is 2w, "
                    "and yours is not: is part of a square detached, or made from a number?")


def _refuse_a_graph_that_misses_parameters(penalty: torch.Tensor, model: nn.Module) -> None:
    """Wrong, with the hint for the mistake, when a penalty in a graph gives some parameter no gradient."""
    if penalty.numel() != 1 or not penalty.requires_grad:
        return                                 # the value and grad_fn checks after this one say what is wrong
    named = dict(model.named_parameters())
    grads = torch.autograd.grad(penalty.reshape(()), list(named.values()), allow_unused=True, retain_graph=True)
    missed = [name for name, grad in zip(named, grads) if grad is None]
    if len(missed) == len(named):
        made = "it is a new leaf" if penalty.is_leaf else "its graph starts from a new leaf"
        raise Wrong(f"no parameter gets a gradient from your penalty: {made}, not computed from the parameters.",
                    hint="requires_grad=True on a tensor made from numbers starts a new graph that no parameter is "
                         "in; compute the penalty from the parameter tensors themselves, with tensor operations")
    if not missed:
        return
    one = len(missed) == 1
    names = f"{', '.join(missed)} {'gets' if one else 'get'} no gradient from your penalty"
    expected = torch.tensor(FIGURES["ch2-penalty-in-graph"]["penalty"])
    if torch.allclose(penalty.detach().reshape(()), expected):  # in the value, but not in the graph
        raise Wrong(f"{names}: {'its square is' if one else 'their squares are'} in its value, but as "
                    f"{'a number' if one else 'numbers'} or detached, so not in the graph.")
    raise Wrong(f"{names}: it leaves {'it' if one else 'them'} out.",
                hint="model.parameters() gives every tensor the optimizer trains, the biases included, and "
                     "the penalty is over all of them")


def _clipping_problem() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    """The check's model (Linear(3, 1)), its SGD optimizer (lr 0.1) and batch, seeded; max_norm is 1.0."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    X = 10 * torch.randn(16, 3, generator=g)               # large inputs: the raw gradient norm is far above 1
    y = torch.randn(16, 1, generator=g)
    model = nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), X, y


@exercise(
    id="ch2-clipped-step", chapter=2,
    task="write clipped_step(model, opt, X, y, max_norm): one SGD step on the MSE loss with the gradient "
         "norm clipped to max_norm; return the norm before clipping as a float",
    hint="clipping rescales .grad, so it has to sit where the gradients exist and the step has not used "
         "them yet; the clipping function already tells you the norm it saw",
)
def check_clipped_step(clipped_step) -> None:
    theirs, opt_theirs, X, y = _clipping_problem()
    figures = FIGURES["ch2-clipped-step"]
    for step in range(3):
        got = calls_stub(clipped_step, theirs, opt_theirs, X, y, 1.0)
        want = figures["norms before clipping"][step]
        if isinstance(got, torch.Tensor):
            raise Wrong("you returned a tensor; the task asks for a Python float: turn the norm into a number.")
        if not isinstance(got, float):
            raise Wrong(f"return the norm as a float, not {type(got).__name__}.")
        if step == 0 and abs(got - 1.0) < 1e-4 < abs(want - 1.0):
            raise Wrong("you returned the norm after clipping; clip_grad_norm_ returns the one before.")
        if abs(got - want) > 1e-3 * max(1.0, abs(want)):
            if step > 0 and got > want:
                raise Wrong(f"step {step + 1}: norm {got:.4g}, expected {want:.4g}: do gradients pile up (zero_grad)?")
            raise Wrong(f"step {step + 1}: norm {got:.4g}, expected {want:.4g}.")
        weights = torch.cat([p.detach().flatten() for p in theirs.parameters()])   # weight (1, 3), then bias
        if not torch.allclose(weights, torch.tensor(figures["weights after each step"][step]), atol=1e-5):
            raise Wrong(f"after step {step + 1} the weights differ from a clipped SGD step: "
                        "clip after backward() and before opt.step().")
