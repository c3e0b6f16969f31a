"""Chapter 1 exercises: broadcasting, dtypes, reductions."""
from __future__ import annotations

import torch

from . import Wrong, calls_stub, exercise


@exercise(
    id="ch1-broadcast-shape", chapter=1,
    task="give the shape of torch.ones(8, 1, 3) + torch.ones(4, 1) as a tuple, without running it",
    hint="align shapes from the right, pad the shorter with 1s, then each dim takes the size of the pair that is not 1",
)
def check_broadcast_shape(answer) -> None:
    if not isinstance(answer, (tuple, list, torch.Size)):
        raise Wrong(f"answer with a tuple such as (2, 3), not a {type(answer).__name__}.")
    if tuple(answer) == (8, 1, 3):
        raise Wrong("size-1 dims stretch to match the other operand; they do not stay 1.")
    if tuple(answer) != tuple((torch.ones(8, 1, 3) + torch.ones(4, 1)).shape):
        raise Wrong(f"{tuple(answer)} is not it.")


@exercise(
    id="ch1-safe-brighten", chapter=1,
    task="write brighten(img, amount) that adds amount to a uint8 image, saturating at 255, "
         "returning uint8 and leaving img unchanged",
    hint="widen first (img.int() or img.float()), add, clamp(0, 255), then .to(torch.uint8)",
)
def check_safe_brighten(brighten) -> None:
    img = torch.tensor([[0, 100, 200, 250]], dtype=torch.uint8)
    before = img.clone()
    out = calls_stub(brighten, img, 10)
    if not isinstance(out, torch.Tensor):
        raise Wrong(f"return a tensor, not {type(out).__name__}.")
    if not torch.equal(img, before):
        raise Wrong("your function changed its input in place.")
    if out.dtype != torch.uint8:
        raise Wrong(f"the result is {out.dtype}; images here are uint8.")
    if out.tolist() != [[10, 110, 210, 255]]:
        raise Wrong(f"brighten(img, 10) gave {out.tolist()} for pixels [[0, 100, 200, 250]].")


@exercise(
    id="ch1-normalize-rows", chapter=1,
    task="write normalize_rows(x) so each row of a 2-D tensor sums to 1, for square and non-square x",
    hint="reduce with keepdim=True so the sums have shape (N, 1) and broadcast along the columns",
)
def check_normalize_rows(normalize_rows) -> None:
    for shape in [(4, 4), (3, 5)]:
        x = torch.arange(1.0, 1.0 + shape[0] * shape[1]).reshape(shape)
        out = calls_stub(normalize_rows, x.clone())
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            raise Wrong(f"for input of shape {shape} return a tensor of the same shape.")
        if not torch.allclose(out.sum(dim=1), torch.ones(shape[0])):
            raise Wrong(f"for shape {shape} the row sums are {[round(v, 3) for v in out.sum(dim=1).tolist()]}.")
