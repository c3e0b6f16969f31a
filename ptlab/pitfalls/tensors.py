"""Chapter 1 pitfalls: shapes, strides, dtypes and aliasing."""
from __future__ import annotations

import warnings

import torch
from torch import nn

from .registry import Outcome, pitfall


def _regression_data(seed: int = 0, n: int = 64):
    """y = 3x - 1 plus a little noise; X is (n, 1), y is (n,) as most datasets store targets."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 1, generator=g)                     # (n, 1)
    y = 3 * X[:, 0] - 1 + 0.1 * torch.randn(n, generator=g)  # (n,)
    return X, y


@pitfall(
    id="broadcast-loss-shape", chapter=1,
    title="A (B, 1) prediction against a (B,) target broadcasts to (B, B)",
    symptom="the model learns only the mean: R² stays near 0 while the loss looks fine",
    why="""MSELoss subtracts target from prediction elementwise; (B, 1) - (B,) broadcasts to a (B, B)
    matrix, so every prediction is compared with every target. The best a model can do against that
    is predict the mean target. PyTorch only emits a UserWarning, easy to miss in a training log.""",
    catch="""Assert shapes before the loss (assert pred.shape == y.shape), squeeze the model's last dim
    or keep targets as (B, 1), and turn warnings into errors in tests (pytest -W error::UserWarning).""",
)
def broadcast_loss_shape(buggy: bool) -> Outcome:
    X, y = _regression_data()                             # X (64, 1), y (64,)
    torch.manual_seed(0)
    model, loss_fn = nn.Linear(1, 1), nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(60):
            pred = model(X)                               # (64, 1)
            if not buggy:
                pred = pred.squeeze(1)                    # FIX: (64,) matches y
            loss = loss_fn(pred, y)                       # BUG: (64, 1) vs (64,) -> (64, 64)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    with torch.no_grad():
        residual = model(X).squeeze(1) - y
        r2 = 1 - residual.pow(2).mean() / y.var(unbiased=False)
    return Outcome(
        figures={"R² on training data": r2.item(), "learned slope (true 3)": model.weight.item(),
                 "UserWarnings raised": len(caught)},
        series={"training loss": losses},
        broken=r2.item() < 0.5,
    )


@pitfall(
    id="view-after-transpose", chapter=1,
    title="view() on a transposed tensor raises; reshape() silently copies",
    symptom="RuntimeError: view size is not compatible with input tensor's size and stride",
    why="""view() never copies: it reinterprets the same memory with new strides. After .t() or
    .permute() the elements are no longer laid out row by row, so no strides can describe the
    flattened tensor without moving data. reshape() returns a view when it can and a copy when it must.""",
    catch="""Use reshape() unless you need the guarantee that no copy happens; check x.is_contiguous()
    and compare data_ptr() before and after to see whether you got a view.""",
)
def view_after_transpose(buggy: bool) -> Outcome:
    x = torch.arange(6).reshape(2, 3)                     # (2, 3), contiguous
    xt = x.t()                                            # (3, 2), same memory, strides (1, 3)
    try:
        if buggy:
            flat = xt.view(-1)                            # BUG: no strides describe this as 1-D
        else:
            flat = xt.reshape(-1)                         # FIX: copies because it must
    except RuntimeError as err:
        return Outcome(figures={"error": str(err).split(" (")[0], "x.t() is contiguous": False},
                       broken=True)
    return Outcome(
        figures={"result": str(flat.tolist()), "x.t() is contiguous": xt.is_contiguous(),
                 "shares memory with x": flat.data_ptr() == x.data_ptr()},
        broken=False,
    )


@pitfall(
    id="uint8-overflow", chapter=1,
    title="Brightening a uint8 image wraps around instead of saturating",
    symptom="adding 100 to every pixel makes over a third of them darker",
    why="""uint8 holds 0..255 and integer arithmetic in PyTorch wraps modulo 256: 200 + 100 is 44.
    Adding a Python int keeps the tensor's dtype (a Python scalar does not promote a tensor), so the
    overflow is silent: no warning, no error.""",
    catch="""Convert images to float (or a wider int) before arithmetic and clamp back:
    (img.float() + 100).clamp(0, 255). Check min/max or a histogram after every pixel transform.""",
)
def uint8_overflow(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=g)  # (C, H, W)
    if buggy:
        brighter = img + 100                              # BUG: uint8 arithmetic wraps at 256
    else:
        brighter = (img.float() + 100).clamp(0, 255).to(torch.uint8)  # FIX: widen, clamp, narrow
    wrapped = (brighter < img).float().mean().item()
    return Outcome(
        figures={"mean before": img.float().mean().item(), "mean after +100": brighter.float().mean().item(),
                 "result dtype": str(brighter.dtype), "pixels that got darker": wrapped},
        broken=wrapped > 0,
    )


def _standardize_inplace(batch: torch.Tensor) -> torch.Tensor:
    batch -= batch.mean(dim=0)                            # BUG: edits the caller's tensor
    return batch


@pitfall(
    id="inplace-alias", chapter=1,
    title="An in-place op through a view or alias edits the original tensor",
    symptom="normalising a batch changes the dataset it was sliced from; a second pass sees other data",
    why="""Basic slicing (data[:32]) returns a view that shares memory with data, and in-place ops
    (-=, add_, clamp_) write through it. Plain assignment (batch = data) copies nothing either.
    The dataset is silently modified and every later epoch trains on different numbers.""",
    catch="""Prefer out-of-place ops in data code (batch = batch - mean), or clone() before editing.
    To test for it, compare a checksum (data.sum()) or data.clone() before and after the call.""",
)
def inplace_alias(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    data = torch.rand(128, 4, generator=g) + 5.0          # (N, F): the "dataset", mean about 5.5
    before = data.clone()
    batch = data[:32]                                     # (32, F): a view of data, no copy
    if buggy:
        _standardize_inplace(batch)                       # BUG: writes through the view into data
    else:
        batch = batch - batch.mean(dim=0)                 # FIX: a new tensor; data untouched
    changed = (data != before).any(dim=1).sum().item()
    return Outcome(
        figures={"dataset rows changed": changed, "max change in dataset": (data - before).abs().max().item(),
                 "batch shares memory with data": batch.data_ptr() == data.data_ptr()},
        broken=changed > 0,
    )


@pitfall(
    id="missing-keepdim", chapter=1,
    title="Normalising rows without keepdim divides the wrong axis when the matrix is square",
    symptom="rows should sum to 1 but do not, and nothing raises when rows == columns",
    why="""x.sum(dim=1) has shape (N,), which broadcasts as a row (1, N) against x (N, C). When N == C
    it divides column j by the sum of row j: no error, wrong numbers. When N != C it raises, which is
    why the bug survives testing on square toy inputs and strikes in production, or the reverse.""",
    catch="""Use keepdim=True for reductions you broadcast back (x / x.sum(dim=1, keepdim=True)), or
    torch.softmax/normalize with an explicit dim; assert the invariant (rows sum to 1) in a test.""",
)
def missing_keepdim(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(4, 4, generator=g)                # (N, C) with N == C == 4
    if buggy:
        probs = scores / scores.sum(dim=1)                # BUG: (4, 4) / (4,) -> divides columns
    else:
        probs = scores / scores.sum(dim=1, keepdim=True)  # FIX: (4, 4) / (4, 1) -> divides rows
    row_sums = probs.sum(dim=1)
    return Outcome(
        figures={"row sums": str([round(v, 3) for v in row_sums.tolist()]),
                 "max |row sum - 1|": (row_sums - 1).abs().max().item()},
        broken=bool(((row_sums - 1).abs() > 1e-5).any()),
    )
