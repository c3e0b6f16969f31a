"""Chapter 2 pitfalls: leaves, accumulation, layers that do not train, leaving the graph, exploding gradients."""
from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.lessons.ch02_autograd.models import ListMLP, graph_nodes, grad_norm, max_change, regression_batch
from ptlab.memory import SavedTensors


@pitfall(
    id="missing-zero-grad", chapter=2,
    title="Gradients pile up without optimizer.zero_grad()",
    symptom="over three identical backward passes the grad norm is 2x, then 3x the first (each within 0.1)",
    why="""`backward()` adds into `.grad`; it never overwrites it. Without `zero_grad()` each step's
    gradient is the sum of every gradient since the last reset, so the update grows with the step
    count and points partly in stale directions.""",
    catch="""Call `optimizer.zero_grad()` (`set_to_none=True` by default) once per step, before `backward()`.
    Log the gradient norm each step: a norm that climbs linearly on similar batches is this bug.""",
)
def missing_zero_grad(buggy: bool) -> Outcome:
    X, y = regression_batch()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)      # lr 0: every step sees the same weights
    norms = []
    for _ in range(3):
        if not buggy:
            opt.zero_grad()                                # FIX: start each step from no gradient
        nn.functional.mse_loss(model(X), y).backward()     # BUG: without zero_grad this adds to .grad
        opt.step()
        norms.append(grad_norm(model))
    return Outcome(
        figures={"grad norm step 1": norms[0], "grad norm step 2": norms[1], "grad norm step 3": norms[2]},
        checks=[Check("step 2 / step 1", norms[1] / norms[0], "in [1.9, 2.1]"),
                Check("step 3 / step 1", norms[2] / norms[0], "in [2.9, 3.1]")],
        series={"grad norm": norms},
    )


@pitfall(
    id="plain-list-of-layers", chapter=2,
    title="Layers kept in a plain Python list are never trained",
    symptom="model.parameters() holds 2 of the 6 parameter tensors; after 20 SGD steps the listed layers' "
            "weights are exactly unchanged",
    why="""`nn.Module` registers a submodule only when it is assigned as an attribute directly, or held
    in `nn.ModuleList` / `nn.ModuleDict`. A plain list hides it: `parameters()`, `state_dict()`, `.to(device)`
    and the optimizer never see those layers. They still run in forward and even get `.grad`, but no
    step ever updates them, and a checkpoint does not contain them.""",
    catch="""Use `nn.ModuleList` / `nn.ModuleDict`. Compare `sum(p.numel() for p in model.parameters())`
    with what you expect, or run `ptlab.diagnose.diagnose_gradients`: it lists unregistered parameters
    by path (`hidden[0].weight`).""",
)
def plain_list_of_layers(buggy: bool) -> Outcome:
    X, y = regression_batch()
    torch.manual_seed(0)
    model = ListMLP()                                     # a head; forward runs model.hidden's layers first
    if buggy:
        model.hidden = [nn.Linear(4, 16), nn.Linear(16, 16)]                 # BUG: a plain list: not registered
    else:
        model.hidden = nn.ModuleList([nn.Linear(4, 16), nn.Linear(16, 16)])  # FIX: registers both layers
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = [layer.weight.detach().clone() for layer in model.hidden]
    for _ in range(20):
        opt.zero_grad()
        nn.functional.mse_loss(model(X), y).backward()
        opt.step()
    change = max_change(before, list(model.hidden))
    registered = len(list(model.parameters()))
    return Outcome(
        figures={"registered parameter tensors": registered, "max change of hidden weights": change},
        checks=[Check("registered parameter tensors, of 6", registered, "== 2"),
                Check("max change of hidden weights", change, "== 0")],
    )


@pitfall(
    id="detach-in-forward", chapter=2,
    title="A .detach() inside forward silently freezes every layer before it",
    symptom="after 5 SGD steps encoder.weight.grad is None and the encoder's weights are exactly unchanged",
    why="""`detach()` returns a tensor with no `grad_fn`, so backward stops there: the layers before it
    are not in the loss's graph and get no gradient (`.grad` stays `None`). The optimizer skips
    parameters whose `.grad` is `None`, so they never move, and nothing raises or warns.""",
    catch="""After one `backward()`, check that every trainable parameter has a `.grad` that is not `None`,
    or run `ptlab.diagnose.diagnose_gradients(model, batch=(X, y), loss_fn=...)`: it names the `detach`
    and the module it ran in.""",
)
def detach_in_forward(buggy: bool) -> Outcome:
    class EncoderHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.head = nn.Linear(4, 8), nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            features = torch.tanh(self.encoder(x))         # (B, 8)
            if buggy:
                return self.head(features.detach())        # BUG: cuts the graph: the encoder gets no gradient
            return self.head(features)                     # FIX: the loss's graph reaches the encoder

    X, y = regression_batch()
    torch.manual_seed(0)
    model = EncoderHead()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [model.encoder.weight.detach().clone()]
    for _ in range(5):
        opt.zero_grad()
        nn.functional.mse_loss(model(X), y).backward()
        opt.step()
    change = max_change(before, [model.encoder])
    no_grad = model.encoder.weight.grad is None
    return Outcome(
        figures={"encoder.weight.grad is None": no_grad, "max change of encoder weights": change},
        checks=[Check("encoder.weight.grad is None", no_grad, "is True"),
                Check("max change of encoder weights", change, "== 0")],
    )


@pitfall(
    id="exploding-gradients-nan", chapter=2,
    title="Unnormalised inputs make gradients explode until the loss is NaN",
    symptom="with features at scale 30 and lr 0.01, the loss passes 1e20 within 40 SGD steps, fewer "
            "than 30 of the 40 losses are finite (the rest are inf or NaN), and the last one is NaN",
    why="""With large inputs the loss surface is steep: a learning rate that would be fine on unit-scale
    data overshoots, each step lands further away, and the gradient grows with the error. In a few
    dozen steps `float32` overflows to `inf`, and `inf - inf` gives `NaN`, which then spreads to every weight.""",
    catch="""Fix the cause: normalise the inputs (or lower the learning rate). Keep
    `torch.nn.utils.clip_grad_norm_` as a guard, not as the fix: it returns the norm before clipping, so
    log it; clipping alone keeps this run finite but it still ends far worse than predicting the mean.
    Stop on a non-finite loss: `if not torch.isfinite(loss): raise`.""",
)
def exploding_gradients_nan(buggy: bool) -> Outcome:
    X, y = regression_batch()
    X = 30 * X                                             # BUG: (B, 4) unnormalised features, scale ~30
    if not buggy:
        X = (X - X.mean(dim=0)) / X.std(dim=0)             # FIX: normalise the inputs
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses, norms = [], []
    for _ in range(40):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        if not buggy:
            norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)  # FIX: a guard, and a norm to log
        else:
            norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()  # BUG: no guard
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    finite = [v for v in losses if math.isfinite(v)]
    return Outcome(
        figures={"first loss": losses[0], "last loss": losses[-1], "largest finite loss": max(finite),
                 "var(y): loss of predicting the mean": y.var(unbiased=False).item(),
                 "steps with a finite loss": len(finite)},   # exact: overflow is 50x away at step 12, 3x past at 13
        checks=[Check("largest finite loss", max(finite), "> 1e20"),
                Check("steps with a finite loss, of 40", len(finite), "< 30"),
                Check("the last loss is NaN", math.isnan(losses[-1]), "is True")],
        series={"log10 loss": [torch.tensor(v).log10().item() for v in losses]},
    )


@pitfall(
    id="item-in-loss-term", chapter=2,
    title="A loss term computed through .item() changes the loss but not the gradient",
    symptom="a weight penalty built with .item() has requires_grad False and leaves the gradient exactly "
            "as without it",
    why="""`.item()` returns a Python float; `torch.tensor(float)` is a new leaf with no history. The penalty
    is added to the loss value you log, so it looks active, but backward cannot reach the weights
    through it: the gradient, and so training, is exactly as if it were not there.""",
    catch="""Build every loss term from tensor operations, never from `.item()`, `.numpy()` or
    `torch.tensor(x)`. Check that each term has a `grad_fn` (`assert term.requires_grad`) before adding it.""",
)
def item_in_loss_term(buggy: bool) -> Outcome:
    X, y = regression_batch()
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
        checks=[Check("penalty requires grad", penalty.requires_grad, "is False"),
                Check("gradient change from the penalty", difference, "== 0")],
    )


@pitfall(
    id="running-loss-keeps-graph", chapter=2,
    title="Summing validation losses as tensors keeps every batch's graph alive",
    symptom="after 20 validation batches every one of the 120 tensors autograd saved for backward is still "
            "alive, and the activations among them (the batch and the weights not counted) hold over 1,000 KiB",
    why="""Outside `torch.no_grad()` every forward records a graph that holds the activations backward
    would need. `total += loss` keeps `total` a tensor with a `grad_fn`, linked to every batch's loss and so
    to every batch's activations: nothing is freed until `total` is, and memory grows batch by batch.
    (After `backward()` the saved activations are freed, which is why this bites in evaluation loops.)""",
    catch="""Accumulate numbers: `total += loss.item()`; and evaluate under `torch.no_grad()` or
    `torch.inference_mode()`, which records no graph at all. Memory that grows per batch is this.""",
)
def running_loss_keeps_graph(buggy: bool) -> Outcome:
    X, y = regression_batch(n=256)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1)).eval()
    total = 0.0
    with SavedTensors() as saved:                          # records what autograd saves for backward
        for _ in range(20):                                # 20 validation batches
            loss = nn.functional.mse_loss(model(X), y)     # saves X, tanh's output (twice), a weight, pred, y
            if buggy:
                total = total + loss                       # BUG: a tensor holding every batch's graph
            else:
                total = total + loss.item()                # FIX: a Python float
    del loss
    alive = saved.alive()                                  # measured: saved tensors not freed yet
    held = saved.held_bytes(exclude=[X, y, *model.parameters()])  # their bytes, activations only
    return Outcome(
        figures={"batches": 20, "tensors saved for backward": saved.recorded,
                 "of them still alive": alive, "KiB of saved activations still held": held // 1024},
        checks=[Check("saved tensors still alive, of 120", alive, "== 120"),
                Check("KiB of saved activations still held", held // 1024, "> 1000")],
    )


@pitfall(
    id="cast-after-requires-grad", chapter=2,
    title="A weight cast or moved after requires_grad=True is not a leaf: it gets no .grad, "
          "and the optimizer refuses it",
    symptom="w = torch.zeros(4, 1, requires_grad=True).to(torch.float64) is not a leaf: after backward its .grad is "
            "None, and torch.optim.SGD([w]) raises ValueError: can't optimize a non-leaf Tensor",
    why="""`requires_grad=True` makes a leaf: a tensor autograd fills `.grad` for. `.to(torch.float64)` (or
    `.to(device)`, `.cuda()`, `.double()`) on it is an operation like any other: it returns a new tensor,
    computed from the leaf and recorded in the graph (`grad_fn` ToCopyBackward0). The variable now names that
    result, which is not a leaf, so backward passes through it to the original float32 tensor, which nothing
    refers to any more. Reading `w.grad` gives None with a UserWarning; a hand-written update `w -= lr * w.grad`
    fails on None; `torch.optim` refuses the tensor outright.""",
    catch="""Create the tensor where and how it will live: `torch.zeros(4, 1, dtype=torch.float64,
    device=device, requires_grad=True)`, or cast first and then call `.requires_grad_()`. Parameters inside an
    `nn.Module` do not have this problem: `module.to(...)` converts them in place and they stay leaves.
    Assert `w.is_leaf` right after creating a weight by hand.""",
)
def cast_after_requires_grad(buggy: bool) -> Outcome:
    X, y = regression_batch(n=64)                         # X (64, 4), y (64, 1), float32
    X, y = X.double(), y.double()
    if buggy:
        w = torch.zeros(4, 1, requires_grad=True).to(torch.float64)   # BUG: the cast's result, not the leaf
    else:
        w = torch.zeros(4, 1, dtype=torch.float64, requires_grad=True)  # FIX: created as a float64 leaf
    first_loss = nn.functional.mse_loss(X @ w, y)
    first_loss.backward()
    with warnings.catch_warnings(record=True) as caught:   # reading a non-leaf's .grad warns
        warnings.simplefilter("always")
        grad_is_none = w.grad is None
    try:
        opt = torch.optim.SGD([w], lr=0.1)
        error = "none"
    except ValueError as err:
        error = f"ValueError: {err}"
    last_loss = "not trained: the optimizer refused w"
    if error == "none":
        for _ in range(50):                                # 50 plain SGD steps on the one batch
            opt.zero_grad()
            loss = nn.functional.mse_loss(X @ w, y)
            loss.backward()
            opt.step()
        last_loss = loss.item()
    return Outcome(
        figures={"w.is_leaf": w.is_leaf, "w.grad_fn": w.grad_fn.name() if w.grad_fn else "None",
                 "w.grad is None after backward": grad_is_none, "warnings when reading w.grad": len(caught),
                 "torch.optim.SGD([w])": error, "loss at the start": first_loss.item(),
                 "loss after 50 SGD steps": last_loss},
        checks=[Check("w.grad is None after backward", grad_is_none, "is True"),
                Check("torch.optim.SGD([w]) refuses it: can't optimize a non-leaf Tensor",
                      "can't optimize a non-leaf Tensor" in error, "is True")],
    )


@pitfall(
    id="carried-state-keeps-graph", chapter=2,
    title="A hidden state carried across steps without detach() fails the second backward; retain_graph=True is no fix",
    symptom="a recurrent cell trained step by step raises 'Trying to backward through the graph a second time' at "
            "step 2; with retain_graph=True and SGD steps it raises the in-place error instead, and without SGD "
            "steps the graph behind the loss is over 5x larger at step 20 than at step 1",
    why="""The new state `h = tanh(cell(h) + x)` is computed from the old one, so each step's graph hangs on
    to the previous step's graph through `h`. Step 1's backward frees what step 1 saved; step 2's backward
    walks on into step 1's nodes and finds their saved tensors gone. `retain_graph=True` keeps them, so every
    backward runs through all earlier steps and every step's saved tensors stay in memory: the work per
    step and the memory held grow with the step number. In a real loop it fails anyway: `opt.step()` changes the
    weights in place, and a later backward that reaches a graph which saved the old weights refuses. Here
    the first graph to save them is step 2's (step 1's input state is a constant zero that needs no
    gradient), so step 3 raises.""",
    catch="""Detach the carried state at the step boundary (`h = h.detach()`): the value carries over, the
    graph does not (truncated backpropagation through time; to backpropagate through k steps, call
    backward and detach every k steps). Read `retain_graph=True` in a training loop as a sign of this bug.
    Cost per step that grows with the step number, or a graph (count the nodes behind `loss.grad_fn`) that
    grows, points here.""",
)
def carried_state_keeps_graph(buggy: bool) -> Outcome:
    xs = torch.randn(20, 4, 8, generator=torch.Generator().manual_seed(0))  # 20 steps of (B, 8) inputs

    def train(retain_graph: bool, sgd: bool) -> tuple[str, str, list[int]]:
        torch.manual_seed(0)
        cell = nn.Linear(8, 8)                              # a recurrent cell: h = tanh(W h + b + x)
        opt = torch.optim.SGD(cell.parameters(), lr=0.01)
        h, nodes = torch.zeros(4, 8), []                    # (B, 8) hidden state
        try:
            for step, x in enumerate(xs, start=1):
                h = torch.tanh(cell(h) + x)                 # BUG: without a detach, h links to every earlier step
                loss = h.pow(2).mean()
                opt.zero_grad()
                loss.backward(retain_graph=retain_graph)
                if sgd:
                    opt.step()
                nodes.append(graph_nodes(loss))
                if not buggy:
                    h = h.detach()                          # FIX: the value carries over, the graph does not
        except RuntimeError as err:
            return f"fails at step {step}", str(err).split(" (")[0].split(":")[0].split("has been ")[-1], nodes
        return f"{len(xs)} steps ran", "", nodes

    plain, plain_error, _ = train(retain_graph=False, sgd=True)
    retained_sgd, retained_error, _ = train(retain_graph=True, sgd=True)
    _, _, nodes = train(retain_graph=True, sgd=False)       # gradients only, weights never change
    return Outcome(
        figures={name: value for name, value in [
            ("backward()", plain), ("its error", plain_error), ("retain_graph=True, SGD", retained_sgd),
            ("the error then", retained_error),
            ("graph nodes, steps 1, 2, 3, 20", ", ".join(str(nodes[i]) for i in (0, 1, 2, -1)))] if value},
        checks=[Check("backward() fails at step 2: 'backward through the graph a second time'",
                      plain == "fails at step 2" and "backward through the graph a second time" in plain_error,
                      "is True"),
                Check("retain_graph=True with SGD steps fails: 'modified by an inplace operation'",
                      retained_error == "modified by an inplace operation", "is True"),
                Check("retain_graph, no SGD: graph nodes at step 20 / step 1", float(nodes[-1] / nodes[0]), "> 5")],
        series={"graph nodes behind the loss (retain_graph, no SGD)": [float(n) for n in nodes]},
    )
