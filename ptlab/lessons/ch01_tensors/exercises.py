"""Chapter 1 exercises: broadcasting, dtypes, reductions."""
from __future__ import annotations

import math

import torch

from ptlab.course.exercises import Wrong, calls_stub, exercise

# The three pairs of exercise 1.1; none of them is printed in the chapter.
BROADCAST_PAIRS = [((6, 1, 3), (5, 1)), ((4, 3), (4,)), ((7,), (7, 1))]


def _broadcast_or_none(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


@exercise(
    id="ch1-broadcast-shape", chapter=1,
    task="without running them, give the shapes of torch.ones(a) + torch.ones(b) for the pairs (a, b) "
         "(6, 1, 3) and (5, 1); (4, 3) and (4,); (7,) and (7, 1): a list of three tuples, None where it raises",
    hint="align the two shapes from the right and pad the shorter with 1s; then look at each pair of sizes: "
         "equal, or one of them 1, or neither",
)
def check_broadcast_shape(answer) -> None:
    if not (isinstance(answer, (list, tuple)) and len(answer) == 3):
        raise Wrong("answer with a list of three entries, one per pair, e.g. [(2, 3), None, (1,)].")
    for i, ((a, b), given) in enumerate(zip(BROADCAST_PAIRS, answer), start=1):
        if given is not None and not isinstance(given, (tuple, list, torch.Size)):
            raise Wrong(f"entry {i}: a tuple of sizes, or None where the sum raises, not a {type(given).__name__}.")
        want = _broadcast_or_none(a, b)
        given = None if given is None else tuple(given)
        if given == want:
            continue
        if want is None:
            raise Wrong(f"entry {i}, {a} + {b}: compare the rightmost sizes of the two shapes.")
        if given is None:
            raise Wrong(f"entry {i}, {a} + {b}: this one does broadcast.")
        if len(given) != len(want):
            raise Wrong(f"entry {i}, {a} + {b}: the result has as many dims as the longer shape.")
        raise Wrong(f"entry {i}, {a} + {b}: {given} is not it; a size-1 dim stretches to the other size.")


@exercise(
    id="ch1-safe-contrast", chapter=1,
    task="write contrast(img, factor) for uint8 images: (pixel - 128) * factor + 128, saturating at 0 "
         "and 255, returning uint8 and leaving img unchanged",
    hint="which intermediate values can fall outside 0..255, in either direction? compute in a dtype that "
         "can hold them, then bring the result back into range before returning to uint8",
)
def check_safe_contrast(contrast) -> None:
    img = torch.tensor([[0, 100, 128, 200, 250]], dtype=torch.uint8)
    before = img.clone()
    for factor, want in [(2, [[0, 72, 128, 255, 255]]), (0.5, [[64, 114, 128, 164, 189]])]:
        out = calls_stub(contrast, img, factor)
        if not isinstance(out, torch.Tensor):
            raise Wrong(f"return a tensor, not {type(out).__name__}.")
        if not torch.equal(img, before):
            raise Wrong("your function changed its input in place.")
        if out.dtype != torch.uint8:
            raise Wrong(f"the result is {out.dtype}; images here are uint8.")
        if out.tolist() != want:
            raise Wrong(f"contrast(img, {factor}) gave {out.tolist()} for pixels {img.tolist()}.")


@exercise(
    id="ch1-normalize-rows", chapter=1,
    task="write standardize_rows(x) so each row of a 2-D tensor has mean 0 and standard deviation 1 "
         "(std with unbiased=False), for square and non-square x",
    hint="two things decide the result: a reduction over dim=1 drops that dim, and the result then "
         "broadcasts along the wrong axis (ask the reduction to keep it); and std divides by n - 1 unless "
         "told otherwise, while the task asks for the divisor n",
)
def check_normalize_rows(standardize_rows) -> None:
    for shape in [(4, 4), (3, 5)]:
        x = torch.arange(1.0, 1.0 + shape[0] * shape[1]).reshape(shape) ** 1.5
        out = calls_stub(standardize_rows, x.clone())
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            raise Wrong(f"for input of shape {shape} return a tensor of the same shape.")
        means, stds = out.mean(dim=1), out.std(dim=1, unbiased=False)
        if not torch.allclose(means, torch.zeros(shape[0]), atol=1e-4):
            raise Wrong(f"for shape {shape} the row means are {[round(v, 3) for v in means.tolist()]}, not 0.")
        if not torch.allclose(stds, torch.ones(shape[0]), atol=1e-3):
            shown = [round(v, 3) for v in stds.tolist()]
            n = shape[1]
            if torch.allclose(stds, torch.full((shape[0],), math.sqrt((n - 1) / n)), atol=1e-3):
                raise Wrong(f"for shape {shape} the row standard deviations are {shown}, not 1: that is "
                            f"sqrt((n - 1) / n) for n = {n}, the mark of dividing by n - 1 (std's default).")
            raise Wrong(f"for shape {shape} the row standard deviations are {shown}, not 1.")
