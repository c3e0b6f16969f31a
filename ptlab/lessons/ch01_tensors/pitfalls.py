"""Chapter 1 pitfalls: shapes, strides, dtypes and aliasing."""
from __future__ import annotations

import warnings

import torch
from torch import nn

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall


def _regression_data(seed: int = 0, n: int = 64):
    """y = 3x - 1 plus a little noise; X is (n, 1), y is (n,) as most datasets store targets."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 1, generator=g)                     # (n, 1)
    y = 3 * X[:, 0] - 1 + 0.1 * torch.randn(n, generator=g)  # (n,)
    return X, y


@pitfall(
    id="broadcast-loss-shape", chapter=1,
    title="A (B, 1) prediction against a (B,) target broadcasts to (B, B)",
    symptom="the model learns only the mean: R² stays below 0.5 and the final loss is var(y) within 10% "
            "(what predicting the mean scores); under the default filter the UserWarning shows once in 60 steps",
    why="""`MSELoss` subtracts target from prediction elementwise; `(B, 1) - (B,)` broadcasts to a `(B, B)`
    matrix, so every prediction is compared with every target. The best a model can do against that
    is predict the mean target, where the loss is `var(y)`: the loss falls to `var(y)` and stops there,
    which looks fine only if nothing compares it with a baseline. PyTorch emits a UserWarning, but the
    default warning filter shows a warning once per message and per line it is attributed to, and for
    `nn.MSELoss` that line is inside torch: one line for the whole run (one more for each other batch
    size, such as a smaller last batch), easy to miss in a long log.""",
    catch="""Assert shapes before the loss (`assert pred.shape == y.shape`), squeeze the model's last dim
    or keep targets as `(B, 1)`, compare the loss with `var(y)` (what predicting the mean scores), and turn
    warnings into errors in tests (`pytest -W error::UserWarning`).""",
)
def broadcast_loss_shape(buggy: bool) -> Outcome:
    X, y = _regression_data()                             # X (64, 1), y (64,)
    torch.manual_seed(0)
    model, loss_fn = nn.Linear(1, 1), nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")                  # the default action: once per source line
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
    var_y = y.var(unbiased=False).item()                  # the loss of always predicting the mean
    return Outcome(
        figures={"R² on training data": r2.item(), "learned slope (true 3)": model.weight.item(),
                 "final loss": losses[-1], "var(y)": var_y,
                 "UserWarnings shown (default filter)": len(caught)},
        checks=[Check("R² on training data", r2.item(), "< 0.5"),
                Check("final loss / var(y)", losses[-1] / var_y, "in [0.9, 1.1]"),
                Check("UserWarnings shown in 60 steps (default filter)", len(caught), "== 1")],
        series={"training loss": losses},
    )


@pitfall(
    id="view-after-transpose", chapter=1,
    title="view() that merges the swapped dims of a transposed tensor raises; reshape() copies",
    symptom="flattening a transposed matrix with view(-1) raises a RuntimeError that starts 'view size is not "
            "compatible'",
    why="""`view()` never copies: it reinterprets the same memory with new strides. After `.t()` or
    `.permute()` the elements are no longer laid out row by row, so no strides can describe a shape
    that merges the swapped dimensions (flattening them) without moving data. A view that only splits
    or adds size-1 dims still works: `mat.t().view(3, 1, 2)` succeeds. `reshape()` returns a view when it
    can and a copy when it must.""",
    catch="""Use `reshape()` unless you need the guarantee that no copy happens; check `x.is_contiguous()`,
    and compare `x.untyped_storage().data_ptr()` with the result's to see whether you got a view.""",
)
def view_after_transpose(buggy: bool) -> Outcome:
    mat = torch.arange(6).reshape(2, 3)                   # (2, 3), contiguous
    mat_t = mat.t()                                       # (3, 2), same memory, strides (1, 3)
    no_merge = tuple(mat_t.view(3, 1, 2).shape)           # splitting, not merging: a view works
    try:
        if buggy:
            flat = mat_t.view(-1)                         # BUG: no strides describe this as 1-D
        else:
            flat = mat_t.reshape(-1)                      # FIX: copies because it must
    except RuntimeError as err:
        message = str(err)
        incompatible = message.startswith("view size is not compatible")
        return Outcome(figures={"error starts": message[:len("view size is not compatible")],
                                "its advice": message.rsplit(". ", 1)[-1],   # "Use .reshape(...) instead."
                                "mat.t().view(3, 1, 2)": f"works, shape {no_merge}"},
                       checks=[Check("flattening mat.t() raises 'view size is not compatible'", incompatible,
                                     "is True")])
    same_storage = flat.untyped_storage().data_ptr() == mat.untyped_storage().data_ptr()
    return Outcome(
        figures={"result": str(flat.tolist()), "mat.t().view(3, 1, 2)": f"works, shape {no_merge}",
                 "shares memory with mat": same_storage},
        checks=[Check("flattening mat.t() raises 'view size is not compatible'", False, "is True")],
    )


@pitfall(
    id="uint8-overflow", chapter=1,
    title="Brightening a uint8 image wraps around instead of saturating",
    symptom="adding 100 to every pixel of a random uint8 image makes over a third of its 3,072 pixels darker",
    why="""`uint8` holds 0..255 and integer arithmetic in PyTorch wraps modulo 256: `200 + 100` is `44`.
    Adding a Python int keeps the tensor's dtype (a Python scalar does not promote a tensor of the same
    category; `img + 100.0` would give `float32`), so the overflow is silent: no warning, no error.""",
    catch="""Do pixel arithmetic in a dtype that holds every intermediate value (float, or a wider int),
    bring the result back into the valid range, and only then narrow to `uint8`. Check `min()`/`max()`
    or a histogram after every pixel transform.""",
)
def uint8_overflow(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=g)  # (C, H, W)
    if buggy:
        brighter = img + 100                              # BUG: uint8 arithmetic wraps at 256
    else:
        brighter = (img.float() + 100).clamp(0, 255).to(torch.uint8)  # FIX: widen, clamp, narrow
    darker = int((brighter < img).sum())                  # exact: the image is fixed by its seed
    return Outcome(
        figures={"mean before": img.float().mean().item(), "mean after +100": brighter.float().mean().item(),
                 "result dtype": str(brighter.dtype), "pixels that got darker": darker},
        checks=[Check("pixels that got darker, of 3,072", darker, "> 1024")],
    )


@pitfall(
    id="inplace-alias", chapter=1,
    title="An in-place op through a view or alias edits the original tensor",
    symptom="centring a 32-row batch in place rewrites those 32 rows of the dataset it was sliced from",
    why="""Basic slicing (`data[:32]`) returns a view that shares memory with `data`, and in-place ops
    (`-=`, `add_`, `clamp_`) write through it. Passing the view to a helper copies nothing either: inside,
    `batch -= ...` writes into `data`. The dataset is silently modified and every later epoch trains on
    different numbers.""",
    catch="""Prefer out-of-place ops in data code (`batch = batch - mean`), or `clone()` before editing.
    To test for it, compare a checksum (`data.sum()`) or `data.clone()` before and after the call.""",
)
def inplace_alias(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    data = torch.rand(128, 4, generator=g) + 5.0          # (N, F): the "dataset", mean about 5.5
    before = data.clone()

    def center(batch: torch.Tensor) -> torch.Tensor:      # a helper: subtract each feature's batch mean
        if buggy:
            batch -= batch.mean(dim=0)                    # BUG: in place: writes through the view into data
            return batch
        return batch - batch.mean(dim=0)                  # FIX: a new tensor; data untouched

    batch = center(data[:32])                             # data[:32] is a view of data, no copy
    changed = int((data != before).any(dim=1).sum())
    shares = batch.untyped_storage().data_ptr() == data.untyped_storage().data_ptr()  # the memory block itself
    return Outcome(
        figures={"dataset rows changed": changed, "max change in dataset": (data - before).abs().max().item(),
                 "batch shares memory with data": shares},
        checks=[Check("dataset rows changed, of 128", changed, "== 32"),
                Check("batch shares memory with data", shares, "is True")],
    )


@pitfall(
    id="missing-keepdim", chapter=1,
    title="Normalising rows without keepdim divides the wrong axis when the matrix is square",
    symptom="on a 4 x 4 matrix the rows should sum to 1, but one is off by more than 0.1, and nothing raises",
    why="""`x.sum(dim=1)` has shape `(N,)`, which broadcasts as a row `(1, N)` against `x` `(N, C)`. When
    `N == C` it divides column j by the sum of row j: no error, wrong numbers. When `N != C` it raises,
    except for a single column (`C == 1`): `(N, 1) / (N,)` silently gives an `(N, N)` matrix. So the bug
    survives tests on square or one-column toy inputs and strikes in production, or the reverse.""",
    catch="""Keep the reduced dim as size 1 in any reduction you broadcast back (the reductions take an
    argument for that), or use `torch.nn.functional.normalize(x, p=1, dim=1)` (for non-negative x), whose
    `dim` is explicit;
    assert the output's shape and the invariant (rows sum to 1) in a test, on an input with several rows
    and a different number of columns.""",
)
def missing_keepdim(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(4, 4, generator=g)                # (N, C) with N == C == 4
    if buggy:
        probs = scores / scores.sum(dim=1)                # BUG: (4, 4) / (4,) -> divides columns
    else:
        probs = scores / scores.sum(dim=1, keepdim=True)  # FIX: (4, 4) / (4, 1) -> divides rows
    row_sums = probs.sum(dim=1)
    worst = (row_sums - 1).abs().max().item()
    return Outcome(
        figures={**{f"sum of row {i}": v for i, v in enumerate(row_sums.tolist())}, "max |row sum - 1|": worst},
        checks=[Check("max |row sum - 1|", worst, "> 0.1")],
    )


@pitfall(
    id="normalize-channel-mean-broadcast", chapter=1,
    title="A (C,) channel mean against a (B, C, H, W) batch lines up with W, not C",
    symptom="on 3 x 3 RGB images (W == C) normalising by a (C,) mean leaves a channel mean more than 1 "
            "from 0 (instead of about 0), silently; the same line raises on 32 x 32 images",
    why="""Broadcasting aligns shapes from the right, so a `(C,)` mean meets the last dim of `(B, C, H, W)`:
    the width. When `W != C` the sizes clash and it raises (unless `W == 1`, which stretches to `C`);
    when `W == C` (3 x 3 crops, a width-3 toy test) it runs and subtracts channel j's mean from column j
    of every channel: no error, wrongly normalised images. A channels-last layout `(B, H, W, C)`, the
    layout of arrays made from PIL or OpenCV images, is where a `(C,)` mean is right.""",
    catch="""Give channel statistics the shape of the channel axis: `(1, C, 1, 1)` (or `(C, 1, 1)`) with
    `view` or `reshape`, or use `torchvision.transforms.Normalize`, which does it for you. After
    normalising, check the per-channel mean over `(0, 2, 3)`: it should be near 0 for every channel.""",
)
def normalize_channel_mean_broadcast(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    mean = torch.tensor([0.2, 0.5, 0.8])                  # (C,): per-channel mean of the dataset
    std = torch.tensor([0.1, 0.1, 0.1])                   # (C,)
    images = mean.view(1, 3, 1, 1) + std.view(1, 3, 1, 1) * torch.randn(256, 3, 3, 3, generator=g)  # (B, C, 3, 3)
    large = mean.view(1, 3, 1, 1) + torch.zeros(4, 3, 32, 32)                                      # (B, C, 32, 32)

    def normalize(x: torch.Tensor) -> torch.Tensor:
        if buggy:
            return (x - mean) / std                       # BUG: (C,) lines up with W, the last dim
        return (x - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)  # FIX: (1, C, 1, 1) lines up with C

    channel_means = normalize(images).mean(dim=(0, 2, 3))  # (C,): should be about 0 each
    worst = channel_means.abs().max().item()
    try:
        normalize(large)
        large_result = "no error"
    except RuntimeError as err:
        large_result = str(err).split(" at non-singleton")[0]   # the message up to where it names the dim
    return Outcome(
        figures={**{f"mean of channel {c} after": v for c, v in enumerate(channel_means.tolist())},
                 "32 x 32 batch": large_result},
        checks=[Check("max |channel mean| after normalising 3 x 3 images", worst, "> 1"),
                Check("normalising 32 x 32 images raises 'must match the size'",
                      "must match the size" in large_result, "is True")],
    )


@pitfall(
    id="reshape-to-reorder-axes", chapter=1,
    title="reshape() or view() from HWC to CHW keeps the shape right and scrambles the pixels; permute() moves axes",
    symptom="reshaping a 32 x 32 RGB image from (H, W, C) to (C, H, W) leaves all 1,024 of its pixels "
            "with channel values that are not their own",
    why="""`reshape` and `view` keep the elements in row-major order (the order a contiguous tensor stores
    them in) and only cut that sequence into a new shape. An `(H, W, C)` image stores R, G, B of pixel (0, 0),
    then of pixel (0, 1), and so on;
    cut into `(C, H, W)`, "channel 0" is the first third of that sequence: the R, G, B values of the first
    third of the pixels. The shape is right, so nothing downstream complains. `permute(2, 0, 1)` renumbers
    the axes instead (a view with new strides), so element `[c, h, w]` is the old `[h, w, c]`.""",
    catch="""To move an axis, use `permute` (or `movedim`); use `reshape`/`view` only to split or merge
    neighbouring axes. After a layout change, check a pixel other than the first: `chw[:, h, w]` must equal
    `hwc[h, w, :]` (at `h = w = 0` channel 0 agrees even after the wrong reshape).""",
)
def reshape_to_reorder_axes(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    hwc = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=g)  # (H, W, C), as PIL/NumPy store it
    if buggy:
        chw = hwc.reshape(3, 32, 32)                      # BUG: same memory order, cut into a new shape
    else:
        chw = hwc.permute(2, 0, 1)                        # FIX: axes renumbered: chw[c, h, w] == hwc[h, w, c]
    same_as_view = torch.equal(hwc.reshape(3, 32, 32), hwc.view(3, 32, 32))  # view() does the same as reshape()
    wrong = int((chw.permute(1, 2, 0) != hwc).any(dim=2).sum())  # pixels whose (R, G, B) is not their own
    return Outcome(
        figures={"result shape": str(tuple(chw.shape)), "pixels with wrong channel values, of 1,024": wrong,
                 "equals hwc.permute(2, 0, 1)": torch.equal(chw, hwc.permute(2, 0, 1)),
                 "hwc.view(3, 32, 32) equals hwc.reshape(3, 32, 32)": same_as_view},
        checks=[Check("pixels with wrong channel values, of 1,024", wrong, "== 1024")],
    )
