"""Chapter 2 pitfalls: autograd, detach, gradient accumulation and gradient size."""
from __future__ import annotations

import gc
import weakref

import torch
from torch import nn

from .registry import Outcome, pitfall


def _regression_batch(seed: int = 0, n: int = 32, features: int = 4):
    """A fixed batch: X (n, features), y (n, 1) = a linear function of X plus noise."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, features, generator=g)                      # (n, F)
    y = X @ torch.randn(features, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)  # (n, 1)
    return X, y


def _grad_norm(model: nn.Module) -> float:
    """The L2 norm of all parameter gradients together."""
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).norm().item()


def _max_change(before: list[torch.Tensor], layers: list[nn.Module]) -> float:
    """Largest absolute change of any weight in layers since the snapshot."""
    return max((b - p.detach()).abs().max().item() for b, p in zip(before, (l.weight for l in layers)))


@pitfall(
    id="missing-zero-grad", chapter=2,
    title="Gradients pile up without optimizer.zero_grad()",
    symptom="grad norm grows 1x, 2x, 3x over three identical backward passes",
    why="""backward() adds into .grad; it never overwrites it. Without zero_grad() each step's
    gradient is the sum of every gradient since the last reset, so the update grows with the step
    count and points partly in stale directions.""",
    catch="""Call optimizer.zero_grad() (set_to_none=True by default) once per step, before backward().
    Log the gradient norm each step: a norm that climbs linearly on similar batches is this bug.""",
)
def missing_zero_grad(buggy: bool) -> Outcome:
    X, y = _regression_batch()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)      # lr 0: every step sees the same weights
    norms = []
    for _ in range(3):
        if not buggy:
            opt.zero_grad()                                # FIX: start each step from no gradient
        nn.functional.mse_loss(model(X), y).backward()     # BUG: without zero_grad this adds to .grad
        opt.step()
        norms.append(_grad_norm(model))
    return Outcome(
        figures={"grad norm step 1": norms[0], "grad norm step 3": norms[2], "step 3 / step 1": norms[2] / norms[0]},
        series={"grad norm": norms},
        broken=norms[2] > 2.5 * norms[0],
    )


class ListMLP(nn.Module):
    """Two hidden layers and a head; the hidden layers sit in a plain list or an nn.ModuleList."""

    def __init__(self, registered: bool):
        super().__init__()
        layers = [nn.Linear(4, 16), nn.Linear(16, 16)]
        self.hidden = nn.ModuleList(layers) if registered else layers
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = torch.relu(layer(x))                       # (B, 16)
        return self.head(x)                                # (B, 1)


@pitfall(
    id="plain-list-of-layers", chapter=2,
    title="Layers kept in a plain Python list are never trained",
    symptom="model.parameters() misses the listed layers; their weights do not move during training",
    why="""nn.Module registers a submodule only when it is assigned as an attribute directly, or held
    in nn.ModuleList / nn.ModuleDict. A plain list hides it: parameters(), state_dict(), .to(device)
    and the optimizer never see those layers. They still run in forward and even get .grad, but no
    step ever updates them, and a checkpoint does not contain them.""",
    catch="""Use nn.ModuleList / nn.ModuleDict. Compare sum(p.numel() for p in model.parameters())
    with what you expect, or run ptlab.diagnose.diagnose_gradients: it lists unregistered parameters
    by path (hidden[0].weight).""",
)
def plain_list_of_layers(buggy: bool) -> Outcome:
    X, y = _regression_batch()
    torch.manual_seed(0)
    if buggy:
        model = ListMLP(registered=False)                 # BUG: self.hidden = [Linear, Linear]
    else:
        model = ListMLP(registered=True)                  # FIX: self.hidden = nn.ModuleList([...])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = [layer.weight.detach().clone() for layer in model.hidden]
    for _ in range(20):
        opt.zero_grad()
        nn.functional.mse_loss(model(X), y).backward()
        opt.step()
    change = _max_change(before, list(model.hidden))
    return Outcome(
        figures={"registered parameter tensors": len(list(model.parameters())),
                 "max change of hidden weights": change},
        broken=change == 0.0,
    )


class EncoderHead(nn.Module):
    """encoder -> head; the buggy variant detaches the features between them."""

    def __init__(self, detach_features: bool):
        super().__init__()
        self.encoder = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)
        self.detach_features = detach_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.tanh(self.encoder(x))             # (B, 8)
        if self.detach_features:
            features = features.detach()                   # cuts the graph: encoder gets no gradient
        return self.head(features)                         # (B, 1)


@pitfall(
    id="detach-in-forward", chapter=2,
    title="A .detach() inside forward silently freezes every layer before it",
    symptom="after training steps the encoder's weights are exactly unchanged; encoder.weight.grad is None",
    why="""detach() returns a tensor with no grad_fn, so backward stops there: the layers before it
    are not in the loss's graph and get no gradient (.grad stays None). The optimizer skips
    parameters whose .grad is None, so they never move, and nothing raises or warns.""",
    catch="""After one backward(), check that every trainable parameter has a .grad that is not None, or
    run ptlab.diagnose.diagnose_gradients(model, batch=(X, y), loss_fn=...): it names the detach and
    the module it ran in.""",
)
def detach_in_forward(buggy: bool) -> Outcome:
    X, y = _regression_batch()
    torch.manual_seed(0)
    if buggy:
        model = EncoderHead(detach_features=True)         # BUG: features.detach() in forward
    else:
        model = EncoderHead(detach_features=False)        # FIX: keep features in the graph
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [model.encoder.weight.detach().clone()]
    for _ in range(5):
        opt.zero_grad()
        nn.functional.mse_loss(model(X), y).backward()
        opt.step()
    change = _max_change(before, [model.encoder])
    return Outcome(
        figures={"encoder.weight.grad is None": model.encoder.weight.grad is None,
                 "max change of encoder weights": change},
        broken=change == 0.0,
    )


@pitfall(
    id="inplace-saved-for-backward", chapter=2,
    title="An in-place edit of a tensor autograd saved breaks backward()",
    symptom="RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation",
    why="""sigmoid saves its output to compute its gradient (s * (1 - s)). Writing into that output
    in place (h[:, 0] = 0, h += 1, relu_) bumps the tensor's version counter; backward compares it
    with the version it saved and refuses rather than use the wrong numbers. The error names the
    op whose saved tensor changed (here "output 0 of Sigmoid") and the versions, not your line.""",
    catch="""Read the message: the shape and op it names point at the tensor. Replace the in-place edit
    with an out-of-place one (h = h * mask, torch.where) or clone() first. tensor._version shows
    how many times a tensor was modified in place.""",
)
def inplace_saved_for_backward(buggy: bool) -> Outcome:
    X, _ = _regression_batch()
    torch.manual_seed(0)
    layer = nn.Linear(4, 3)
    h = torch.sigmoid(layer(X))                            # (B, 3); sigmoid saves h for backward
    mask = torch.tensor([0.0, 1.0, 1.0])                   # switch off feature 0
    if buggy:
        h[:, 0] = 0.0                                      # BUG: writes into the saved output
    else:
        h = h * mask                                       # FIX: a new tensor; the saved one is intact
    try:
        h.sum().backward()
    except RuntimeError as err:
        message, detail = str(err).split(" Hint:")[0].split(": ", 1)   # detail: which tensor, which versions
        tensor, versions = detail.split(", is at ")
        return Outcome(figures={"error": message, "tensor": tensor, "versions": "is at " + versions,
                                "h._version": h._version}, broken=True)
    return Outcome(figures={"grad norm of layer.weight": layer.weight.grad.norm().item(),
                            "h._version": h._version}, broken=False)


@pitfall(
    id="exploding-gradients-nan", chapter=2,
    title="Too large a step makes gradients explode until the loss is NaN",
    symptom="the loss grows by orders of magnitude each step, overflows to inf, then becomes NaN",
    why="""With large inputs the loss surface is steep: a learning rate that would be fine on unit-scale
    data overshoots, each step lands further away, and the gradient grows with the error. In a few
    dozen steps float32 overflows to inf, and inf - inf gives NaN, which then spreads to every weight.""",
    catch="""Clip the global gradient norm (torch.nn.utils.clip_grad_norm_ returns the norm before
    clipping: log it), lower the learning rate, or normalise the inputs. Stop on a non-finite loss:
    if not torch.isfinite(loss): raise.""",
)
def exploding_gradients_nan(buggy: bool) -> Outcome:
    X, y = _regression_batch()
    X = 30 * X                                             # (B, 4) unnormalised features, scale ~30
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses, norms = [], []
    for _ in range(40):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        if not buggy:
            norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # FIX: cap the step size
        else:
            norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()  # BUG: no cap
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    finite = [v for v in losses if torch.isfinite(torch.tensor(v))]
    return Outcome(
        figures={"first loss": losses[0], "last loss": losses[-1], "largest finite loss": max(finite),
                 "steps with a finite loss": len(finite)},
        series={"log10 loss": [torch.tensor(v).log10().item() for v in losses]},
        broken=len(finite) < len(losses),
    )


@pitfall(
    id="item-in-loss-term", chapter=2,
    title="A loss term computed through .item() changes the loss but not the gradient",
    symptom="adding a weight penalty built with .item() leaves the gradient exactly as without it",
    why=""".item() returns a Python float; torch.tensor(float) is a new leaf with no history. The penalty
    is added to the loss value you log, so it looks active, but backward cannot reach the weights
    through it: the gradient, and so training, is exactly as if it were not there.""",
    catch="""Build every loss term from tensors (w.pow(2).sum()), never from .item(), .numpy() or
    torch.tensor(x). Check that each term has a grad_fn (assert term.requires_grad) before adding it.""",
)
def item_in_loss_term(buggy: bool) -> Outcome:
    X, y = _regression_batch()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    data_loss = nn.functional.mse_loss(model(X), y)
    grad_without = torch.autograd.grad(data_loss, model.weight, retain_graph=True)[0]
    if buggy:
        penalty = torch.tensor(model.weight.pow(2).sum().item())   # BUG: a number, no graph
    else:
        penalty = model.weight.pow(2).sum()                        # FIX: stays in the graph
    loss = data_loss + 1.0 * penalty
    grad_with = torch.autograd.grad(loss, model.weight)[0]
    difference = (grad_with - grad_without).norm().item()
    return Outcome(
        figures={"penalty value": penalty.item(), "penalty requires grad": penalty.requires_grad,
                 "gradient change from the penalty": difference},
        broken=difference == 0.0,
    )


@pitfall(
    id="running-loss-keeps-graph", chapter=2,
    title="Summing validation losses as tensors keeps every batch's graph alive",
    symptom="after 20 validation batches, the activations of all 20 forward passes are still in memory",
    why="""Outside torch.no_grad() every forward records a graph that holds the activations backward
    would need. total += loss keeps total a tensor with a grad_fn, linked to every batch's loss and so
    to every batch's activations: nothing is freed until total is, and memory grows batch by batch.
    (After backward() the saved activations are freed, which is why this bites in evaluation loops.)""",
    catch="""Accumulate numbers: total += loss.item(); and evaluate under torch.no_grad() or
    torch.inference_mode(), which records no graph at all. Memory that grows per batch is this.""",
)
def running_loss_keeps_graph(buggy: bool) -> Outcome:
    X, y = _regression_batch(n=256)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1)).eval()
    activations, total = [], 0.0
    for _ in range(20):                                    # 20 validation batches
        hidden = model[1](model[0](X))                     # (B, 64): saved by tanh and the last Linear
        loss = nn.functional.mse_loss(model[2](hidden), y)
        activations.append(weakref.ref(hidden))
        if buggy:
            total = total + loss                           # BUG: a tensor holding every batch's graph
        else:
            total = total + loss.item()                    # FIX: a Python float
    del hidden, loss
    gc.collect()
    alive = sum(ref() is not None for ref in activations)
    return Outcome(
        figures={"batches": len(activations), "activations still alive": alive,
                 "KiB held by them": alive * 256 * 64 * 4 / 1024},
        broken=alive > 1,
    )
