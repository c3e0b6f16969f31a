"""torch.export and ONNX: dynamic dims, .pt2 and .onnx files, verification against eager on several shapes.

Files go where the caller says (a temporary directory in the notebook); functions return file names and
sizes, never this machine's paths.
"""
from __future__ import annotations

import contextlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from .claims import measured, measured_seconds
from .compiling import quiet_compile_logs

Shape = tuple[int, ...]


def dynamic_shapes_for(dims: dict[int, str], *, max_size: int = 1024) -> dict[str, dict[int, torch.export.Dim]]:
    """dynamic_shapes for a model whose forward takes one argument `x`: {dim index: Dim(name)}."""
    if not isinstance(dims, dict) or not all(isinstance(i, int) and isinstance(n, str) for i, n in dims.items()):
        raise TypeError(f"dims must map a dim index (int) to a name (str), got {dims!r}")
    return {"x": {index: torch.export.Dim(name, max=max_size) for index, name in dims.items()}}


def export_program(model: nn.Module, example: torch.Tensor, dims: dict[int, str]) -> torch.export.ExportedProgram:
    """torch.export.export(model, (example,), dynamic_shapes={"x": {index: Dim(name, max=1024)}}).

    The named dims of the input `x` are dynamic (up to 1,024), every other dim is fixed to the example's
    size. Export traces non-strict by default in this torch version (strict=False).
    """
    if not isinstance(example, torch.Tensor):
        raise TypeError(f"example must be a tensor, got {type(example).__name__}")
    with quiet_compile_logs():
        return torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes_for(dims) if dims else None)


def save_and_load_pt2(program: torch.export.ExportedProgram, directory: str | os.PathLike,
                      name: str = "model.pt2") -> tuple[torch.export.ExportedProgram, int]:
    """Save an ExportedProgram as directory/name and load it back; returns (loaded, file size in bytes)."""
    if not name.endswith(".pt2"):
        raise ValueError(f"an ExportedProgram file is named *.pt2, got {name!r}")
    path = Path(directory) / name
    torch.export.save(program, path)
    return torch.export.load(path), path.stat().st_size


# The exporter's note that two dims it found equal share one name in the ONNX file: noise in a notebook.
# Every other warning gets through, torch's "Exporting a model while it is in training mode" included.
_EXPORTER_NOTES = (r"# The axis name: .* will not be used, since it shares the same shape constraints",)


def export_onnx(model: nn.Module, example: torch.Tensor, path: str | os.PathLike, dims: dict[int, str]) -> int:
    """Export with the default (dynamo) ONNX exporter, the named dims of the input dynamic; returns the file size."""
    if not str(path).endswith(".onnx"):
        raise ValueError(f"an ONNX file is named *.onnx, got {str(path)!r}")
    # By position, not by name: the ONNX input keeps forward's argument name (`input` for an nn.Sequential).
    dynamic_shapes = tuple(dynamic_shapes_for(dims).values()) if dims else None
    with quiet_compile_logs(), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        for note in _EXPORTER_NOTES:   # only these: a train-mode export or your model's own warnings get through
            warnings.filterwarnings("ignore", message=note, category=UserWarning)
        program = torch.onnx.export(model, (example,), dynamic_shapes=dynamic_shapes, verbose=False)
    program.save(str(path))
    return Path(path).stat().st_size


def onnx_session(path: str | os.PathLike, threads: int | None = None):
    """An onnxruntime InferenceSession on the CPU; `threads` sets its own thread pools (None: onnxruntime's
    default, one intra-op thread per physical core, whatever torch.set_num_threads says)."""
    import onnxruntime

    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3          # errors only: ORT's own warnings go to stderr otherwise
    if threads is not None:
        options.intra_op_num_threads = options.inter_op_num_threads = threads
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_input_shapes(session) -> dict[str, list]:
    """Each input's shape as ONNX stores it: ints are fixed, names are dynamic."""
    return {i.name: list(i.shape) for i in session.get_inputs()}


def run_onnx(session, x: torch.Tensor) -> torch.Tensor:
    """The session's first output for input x, as a tensor."""
    name = session.get_inputs()[0].name
    return torch.from_numpy(session.run(None, {name: x.detach().numpy()})[0])


def max_abs_diffs(reference: Callable[[torch.Tensor], torch.Tensor], candidate: Callable[[torch.Tensor], torch.Tensor],
                  shapes: Sequence[Shape], seed: int = 0) -> dict[Shape, float]:
    """max |reference(x) - candidate(x)| for a seeded random x of each shape."""
    if not shapes:
        raise ValueError("give at least one input shape")
    generator = torch.Generator().manual_seed(seed)
    diffs = {}
    with torch.no_grad():
        for shape in shapes:
            x = torch.randn(*shape, generator=generator)
            diffs[tuple(shape)] = (reference(x) - candidate(x)).abs().max().item()
    return diffs


def format_diffs(diffs: dict[Shape, float], tolerance: float) -> str:
    """One line per input shape: the max abs difference and whether it is within the tolerance."""
    return "\n".join(f"input {str(shape):<16}max abs diff {measured(d, 3):<12}within {tolerance:g}: {d <= tolerance}"
                     for shape, d in diffs.items())


# ------------------------------------------------------------------------------------------- latency
@dataclass(frozen=True)
class LatencyRow:
    name: str
    seconds: float


def time_side_by_side(calls: dict[str, Callable[[], object]], *, repeats: int = 15,
                      warmup: int = 3) -> list[LatencyRow]:
    """Median time per call of each callable, the callables interleaved round by round."""
    import statistics
    import time

    if len(calls) < 2:
        raise ValueError("time_side_by_side compares at least two callables")
    for call in calls.values():
        for _ in range(warmup):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls.items())
    for i in range(repeats):
        for name, call in (order if i % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return [LatencyRow(name, statistics.median(ts)) for name, ts in times.items()]


def format_latency_table(rows: list[LatencyRow]) -> str:
    """Median per call and the speed-up over the first row (its time / this row's time: above 1 is faster).

    The same convention as `ptlab.compiling.CompileReport.speedup` (eager time / compiled time).
    """
    base = rows[0].seconds
    lines = [f"{'runtime':<20}{'median/call':<14}speed-up vs {rows[0].name}"]
    lines += [f"{r.name:<20}{measured_seconds(r.seconds):<14}{measured(base / r.seconds, 3)}" for r in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- quantization
def serialized_bytes(model: nn.Module) -> int:
    """Bytes of torch.save(model.state_dict()): what the weights cost on disk."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getbuffer().nbytes
