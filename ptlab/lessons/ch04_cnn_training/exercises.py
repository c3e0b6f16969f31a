"""Chapter 4 exercises: fix a training loop, write an evaluation that leaves no trace, read the overfit ritual."""
from __future__ import annotations

import math

import torch
from torch import nn

from ptlab.claims import measured
from ptlab.course.exercises import NotAttempted, Wrong, calls_stub, exercise
from ptlab.lessons.ch04_cnn_training.exercise_figures import FIGURES
from ptlab.models import SmallCNN
from ptlab.overfit import overfit_one_batch


def _tiny_problem(seed: int = 0, sizes: tuple[int, ...] = (16, 16, 16, 16),
                  ) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A small MLP with BatchNorm and Dropout, and fixed batches of the given sizes (8 features, 3 classes)."""
    g = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in sizes]
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    return model, batches


# Exercise 4.1's loop exactly as the notebook hands it out, four bugs included: checked, it is "not attempted".
# (No docstring: it would be one of the code's constants, and the notebook's copy has none.)
def untouched_train_steps(model, optimizer, batches):
    model.eval()
    total = 0
    for X, y in batches:
        probs = model(X).softmax(dim=1)
        loss = nn.functional.cross_entropy(probs, y)
        loss.backward()
        optimizer.step()
        total = total + loss
    return total / len(batches)


def _same_code(fn, other) -> bool:
    """True when fn compiles to the same code as other (its source unchanged, wherever it was defined)."""
    a, b = getattr(fn, "__code__", None), other.__code__
    fields = ("co_code", "co_names", "co_varnames", "co_consts")
    return a is not None and all(getattr(a, f) == getattr(b, f) for f in fields)


def _run(train_steps, seed: int = 0) -> tuple[object, nn.Module]:
    model, batches = _tiny_problem(seed)
    model.eval()  # a loop must set train mode itself
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)  # the dropout masks the stored weights were made with
    result = calls_stub(train_steps, model, optimizer, batches)
    return result, model


def _matches(model: nn.Module, weights: dict[str, list[float]]) -> bool:
    """Whether the model's parameters are the stored ones (by name, flattened)."""
    return all(torch.allclose(p.detach().flatten(), torch.tensor(weights[name]), atol=1e-6)
               for name, p in model.named_parameters())


@exercise(
    id="ch4-fix-training-loop", chapter=4,
    task="fix its four bugs; return the mean loss as a float",
    hint="check the four things every training step depends on: the mode the model is in, what cross_entropy "
         "expects as its input, the gradients left by the previous batch, and what a running total of tensors keeps "
         "alive",
)
def check_fix_training_loop(train_steps) -> None:
    if _same_code(train_steps, untouched_train_steps):
        raise NotAttempted
    result, model = _run(train_steps)
    if isinstance(result, torch.Tensor):
        raise Wrong("you return a tensor, not a float; and each loss tensor added to a running total keeps "
                    "something of its batch alive.")
    if not isinstance(result, (int, float)) or not math.isfinite(result):
        raise Wrong(f"return the mean loss as a float, got {result!r}.")
    if not model.training:
        raise Wrong("after your loop BatchNorm and Dropout still behave as they do at evaluation.")
    figures = FIGURES["ch4-fix-training-loop"]
    if not _matches(model, figures["weights"]):
        if _matches(model, figures["weights without zero_grad"]):
            raise Wrong("the weights moved as if each step used the sum of every gradient so far.")
        if _matches(model, figures["weights with softmax into cross_entropy"]):
            raise Wrong("the weights moved as if cross_entropy had been given something other than what it "
                        "expects as input.")
        raise Wrong("after your loop the weights differ from a correct loop's.")
    expected = figures["mean loss"]
    if abs(result - expected) > 1e-5:
        raise Wrong(f"the weights are right, but you return {measured(result)}; the mean training loss was "
                    f"{measured(expected)}.")


EVAL_BATCH_SIZES = (16, 16, 16, 6)   # unequal, as a DataLoader's last batch often is


@exercise(
    id="ch4-evaluate-without-side-effects", chapter=4,
    task="accuracy over all examples, leaving no trace",
    hint="leave no trace: find out which mode the model is in before you change it, and put back exactly that "
         "mode at the end; counting right answers needs no autograd graph",
)
def check_evaluate_without_side_effects(measure_accuracy) -> None:
    model, batches = _tiny_problem(seed=2, sizes=EVAL_BATCH_SIZES)
    model.train()
    buffers = [b.clone() for b in model.buffers()]
    grad_modes = []
    model.register_forward_hook(lambda m, i, o: grad_modes.append(torch.is_grad_enabled()))
    result = calls_stub(measure_accuracy, model, batches)
    if isinstance(result, torch.Tensor):
        raise Wrong("return a Python float (use .item()), not a tensor.")
    if not isinstance(result, (int, float)) or not 0.0 <= result <= 1.0:
        raise Wrong(f"return the accuracy as a float between 0 and 1, got {result!r}.")
    if any(not torch.equal(a, b) for a, b in zip(buffers, model.buffers())):
        raise Wrong("BatchNorm's running statistics changed: the forward passes ran in train mode.")
    if not grad_modes:
        raise Wrong("your function never called the model.")
    if any(grad_modes):
        raise Wrong("the forward passes recorded an autograd graph, which counting right answers never needs.")
    if not model.training:
        raise Wrong("the model was in train mode before and is in eval mode now: restore its mode.")
    figures = FIGURES["ch4-evaluate-without-side-effects"]
    sizes = " + ".join(str(len(y)) for _, y in batches)
    examples = sum(len(y) for _, y in batches)
    if abs(result - figures["mean of per-batch accuracies"]) <= 1e-9:
        raise Wrong(f"you return the mean of the {len(batches)} batches' accuracies, {measured(result)}; the batches "
                    f"hold {sizes} examples, so that mean weighs each of the last batch's examples more than the "
                    "others'.", hint="count the right answers over all batches, and divide once by the number of "
                                     "examples (the batches need not be the same size)")
    if abs(result - figures["right answers"] / (len(batches) * len(batches[0][1]))) <= 1e-9:
        raise Wrong(f"you divide by {len(batches)} x {len(batches[0][1])} = {len(batches) * len(batches[0][1])}, "
                    f"but the batches hold {sizes} = {examples} examples.",
                    hint="add up len(y) over the batches: a last batch is often smaller")
    if abs(result - figures["accuracy"]) > 1e-9:
        raise Wrong(f"you return {measured(result)}; the accuracy over all {examples} examples is "
                    f"{measured(figures['accuracy'])}.")
    model.eval()                                                # and from eval mode, eval mode it must stay
    calls_stub(measure_accuracy, model, batches)
    if model.training:
        raise Wrong("called on a model in eval mode, your function left it in train mode: restore the mode it had, "
                    "whichever that was.")


def mystery_setup() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A SmallCNN and one batch of 16 images that will not overfit: find out why with overfit_one_batch."""

    torch.manual_seed(0)
    model = SmallCNN(width=8)
    for name, parameter in model.named_parameters():
        if name.startswith(("features.4", "head")):             # the last stage and the head
            parameter.requires_grad = False
    g = torch.Generator().manual_seed(0)
    return model, (torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g))


@exercise(
    id="ch4-overfit-cause", chapter=4,
    task="write unblock(model): in place, make all of it learn again",
    hint="run overfit_one_batch on the model and batch (catch OverfitFailed) and read the likely causes: each "
         "says what stops learning and where; undo that on the model itself, then run the ritual again",
)
def check_overfit_cause(unblock) -> None:
    model, batch = mystery_setup()
    originals = dict(model.named_parameters())
    values = {name: p.detach().clone() for name, p in originals.items()}
    result = calls_stub(unblock, model)
    if result is not model:
        raise Wrong("change the model you are given in place and return that same model (not a copy or a new "
                    f"one), got {type(result).__name__}.")
    now = dict(model.named_parameters())
    if now.keys() != originals.keys() or any(now[n] is not originals[n] for n in now):
        raise Wrong("you replaced parameters or modules: keep the model's own parameters and change what stops "
                    "them from learning.")
    if any(not torch.equal(now[n].detach(), values[n]) for n in now):
        raise Wrong("the weights changed: keep them as they are; the problem is not their values.")
    report = overfit_one_batch(model, batch, raise_on_failure=False)
    if not report.passed:
        causes = ", ".join(report.causes) or "none named"
        raise Wrong(f"it still does not overfit its batch; the report's likely causes now: {causes}.")
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise Wrong(f"the ritual passes now, but {len(frozen)} of {len(now)} parameter tensors still do not learn: "
                    f"{', '.join(frozen)}. Sixteen images can be memorised without them; a real training run "
                    "would leave them as they are.",
                    hint="the first report counted the frozen tensors: set requires_grad back on every one of them")
