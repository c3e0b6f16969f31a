"""Chapter 2 pitfalls: in-place writes into tensors autograd saved, through a view, a residual `+=` and `.data`."""
from __future__ import annotations

import torch
from torch import nn

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.lessons.ch02_autograd.models import regression_batch

def _error_parts(err: RuntimeError) -> dict[str, str]:
    """The in-place error in its parts: what it says, the tensor it names, the versions, and the hint's advice."""
    text, _, hint = str(err).partition(" Hint: ")
    message, detail = text.split(": ", 1)
    tensor, versions = detail.split(", is at ")
    parts = {"error says": message.split("has been ")[-1], "tensor": tensor, "versions": "is at " + versions}
    if hint:
        parts["hint names"] = hint.split(" with ")[-1].rstrip(".")
    return parts


@pitfall(
    id="inplace-saved-for-backward", chapter=2,
    title="An in-place edit of a tensor autograd saved breaks backward()",
    symptom="backward() raises RuntimeError: one of the variables needed for gradient computation has been "
            "modified by an inplace operation, naming output 0 of Sigmoid",
    why="""`sigmoid` saves its output to compute its gradient (`s * (1 - s)`). Writing into that output
    in place (`h[:, 0] = 0`, `h += 1`, `relu_`) bumps the tensor's version counter; backward compares it
    with the version it saved and refuses rather than use the wrong numbers. The error gives the tensor's
    shape and the versions, and the op it names depends on how the tensor was saved. An op that saved its
    own output (sigmoid, relu, tanh) is named even after a recorded write: here "output 0 of Sigmoid",
    though `h[:, 0] = 0` made `CopySlices` the tensor's `grad_fn`. For a tensor an op saved as an input
    (mul, pow), the message names the tensor's `grad_fn` when backward runs: the op that made it, or the
    in-place write itself when autograd recorded that write. No line of your code is named, and its hint
    points at anomaly detection.""",
    catch="""Read the message: the shape and the op it names point at the tensor. Rerun the step under
    `torch.autograd.detect_anomaly()` (or `set_detect_anomaly(True)`): the failing backward then warns with
    the traceback of the forward call whose backward needed the tensor, the op that saved it. Then look for
    a write into that tensor after that op and before `backward()` (a write before the save is harmless).
    Replace it with an out-of-place edit (`h = h * mask`, `torch.where`) or `clone()` first.
    `tensor._version` shows how many times a tensor was modified in place.""",
)
def inplace_saved_for_backward(buggy: bool) -> Outcome:
    X, _ = regression_batch()
    torch.manual_seed(0)
    layer = nn.Linear(4, 3)
    h = torch.sigmoid(layer(X))                            # (B, 3); sigmoid saves h for backward
    mask = torch.tensor([0.0, 1.0, 1.0])                   # switch off feature 0
    if buggy:
        h[:, 0] = 0.0                                      # BUG: writes into the saved output
    else:
        h = h * mask                                       # FIX: a new tensor; the saved one is intact
    what = "backward() raises the in-place error naming 'output 0 of Sigmoid'"
    try:
        h.sum().backward()
    except RuntimeError as err:
        parts = _error_parts(err)
        named = parts["error says"] == "modified by an inplace operation" and "output 0 of Sigmoid" in parts["tensor"]
        return Outcome(figures={**parts, "h.grad_fn before backward": h.grad_fn.name(), "h._version": h._version},
                       checks=[Check(what, named, "is True")])
    return Outcome(figures={"grad norm of layer.weight": layer.weight.grad.norm().item(),
                            "h.grad_fn before backward": h.grad_fn.name(), "h._version": h._version},
                   checks=[Check(what, False, "is True")])


@pitfall(
    id="residual-inplace-add", chapter=2,
    title="A residual out += identity inside a module breaks backward() when out was saved for backward",
    symptom="backward() raises RuntimeError: one of the variables needed for gradient computation has been "
            "modified by an inplace operation, naming output 0 of Relu",
    why="""`torch.relu` saves its output: its backward passes the gradient where that output is positive.
    The block then adds the skip connection in place, `out += identity`, into that very tensor. The
    forward is right (the numbers are those of `out = out + identity`), but the write bumped the tensor's
    version counter, and when backward reaches relu it finds its saved output changed and refuses. The
    error comes from the training loop's `loss.backward()`, far from the block, and names the tensor by
    its shape and by relu, which saved it as its output, not by the `+=`. Whether `+=` is safe depends on
    whether any op saved `out`: torchvision's ResNet adds in place onto BatchNorm's output, which
    BatchNorm's backward does not need, then applies ReLU.""",
    catch="""Write residuals out of place: `out = out + identity`. Keep an in-place op (`+=`, `add_`,
    `relu_`, `nn.ReLU(inplace=True)`) only on a tensor no backward needs: neither the op that made it nor
    any later op that read it may have saved it (or a view of it) for backward. Test one backward through
    the module after any such change; `ptlab.diagnose.diagnose_gradients` names the in-place ops it saw in
    forward, those called with `inplace=True` included. When the error names an op inside a module, look
    for an in-place write after it in that module's forward.""",
)
def residual_inplace_add(buggy: bool) -> Outcome:
    class ResidualBlock(nn.Module):                        # x + relu(fc2(relu(fc1(x)))), (B, W) -> (B, W)
        def __init__(self, width: int):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = x
            out = torch.relu(self.fc2(torch.relu(self.fc1(x))))   # relu saves its output: its backward needs it
            if buggy:
                out += identity                            # BUG: writes into the output relu saved
            else:
                out = out + identity                       # FIX: a new tensor; relu's output stays intact
            return out

    X, y = regression_batch()                              # X (32, 4), y (32, 1)
    torch.manual_seed(0)
    block = ResidualBlock(16)
    model = nn.Sequential(nn.Linear(4, 16), block, nn.Linear(16, 1))
    loss = nn.functional.mse_loss(model(X), y)             # forward: no error either way
    what = "backward() raises the in-place error naming 'output 0 of Relu'"
    try:
        loss.backward()
    except RuntimeError as err:
        parts = _error_parts(err)
        named = parts["error says"] == "modified by an inplace operation" and "output 0 of Relu" in parts["tensor"]
        return Outcome(figures={"loss": loss.item(), "backward() says": parts["error says"],
                                "tensor": parts["tensor"], "versions": parts["versions"]},
                       checks=[Check(what, named, "is True")])
    return Outcome(figures={"loss": loss.item(), "backward() says": "no error",
                            "grad norm of fc1.weight": block.fc1.weight.grad.norm().item()},
                   checks=[Check(what, False, "is True")])


@pitfall(
    id="inplace-through-data", chapter=2,
    title="An in-place edit through .data gives a silently wrong gradient; through detach() it raises",
    symptom="after halving a saved sigmoid output through .data, backward() runs without an error and "
            "the gradient is off from the true derivative of the halved output by more than 0.01",
    why="""`.data` gives the same memory as a tensor autograd does not track, with a version counter of its
    own: an in-place edit through it is invisible to autograd. Here `sigmoid` saved its output `s` to
    compute `s * (1 - s)` in backward; halving `s` through `.data` changes what backward reads, and
    backward uses the changed numbers without a word. `detach()` also gives the same memory outside the
    graph, but it shares the version counter with `s`, so the same edit bumps `s._version` and backward
    refuses with the in-place error instead of returning wrong numbers.""",
    catch="""Do not use `.data` in new code: edit out of place (`s = s * 0.5`), use `detach()` to read
    values outside the graph (an in-place edit through it makes backward refuse instead of lie), and
    `with torch.no_grad():` to update parameters in place, as optimizers do. Check a suspicious gradient
    against `torch.autograd.gradcheck` or a finite difference on a small input.""",
)
def inplace_through_data(buggy: bool) -> Outcome:
    z = torch.linspace(-2.0, 2.0, 8, requires_grad=True)   # (8,)
    s = torch.sigmoid(z)                                    # saves s: backward computes s * (1 - s)
    true_grad = (0.5 * s * (1 - s)).detach()                # d sum(0.5 * sigmoid(z)) / dz at these z
    if buggy:
        s.data.mul_(0.5)                                    # BUG: autograd cannot see this edit
    else:
        s = s * 0.5                                         # FIX: a new tensor; the saved s is intact
    s.sum().backward()                                      # no error either way
    error = (z.grad - true_grad).abs().max().item()
    return Outcome(figures={"backward()": "ran, no error", "s._version after the edit": s._version,
                            "max |z.grad - true derivative|": error},
                   checks=[Check("max |z.grad - true derivative|", error, "> 0.01")])
