"""What a GPU measured, kept as data: the course's recorded GPU runs, shown where no GPU is at hand.

Each run is one JSON file in the repository's `data/gpu_runs/`: the GPU, the torch and CUDA versions, the
date, notes on the machine, the sources of its figures, and per lesson a list of figures
(`{"what", "value", "unit", "source"}`). `recorded("ch06-fp16-smallcnn")` prints a lesson's figures from every
run, each block labelled "recorded on <GPU>, torch <version>, <date> (not measured here)".

`record_figures(lesson_id, figures, source)` is called by a GPU cell after it measured: when the environment
variable PTLAB_GPU_RECORD names a file, it adds this GPU's figures to that file (creating it with this
machine's header), so a borrowed GPU run leaves a record to commit into `data/gpu_runs/`; without the
variable it does nothing. `recorded()` never reads the file PTLAB_GPU_RECORD names, so a run in progress
does not change the outputs it is compared against.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

try:
    import fcntl                    # Linux and macOS: a lock for writers in parallel lanes
except ImportError:                 # Windows: no lock; one writer at a time is then the caller's to ensure
    fcntl = None

RECORD_ENV = "PTLAB_GPU_RECORD"
RUNS_DIR = Path(__file__).resolve().parent.parent / "data" / "gpu_runs"   # the checkout's records
FORMAT = 1

# Every lesson that measures on a GPU, by id: what its GPU cell measures.
LESSONS: dict[str, str] = {
    "ch05-async": "chapter 5: a CUDA step returns before the GPU has run it; .item() waits",
    "ch05-gpu-profile": "chapter 5: a GPU training step in torch.profiler: kernel launches, device time, sync rows",
    "ch05-gpu-memory": "chapter 5: allocated, reserved and peak memory around a step and an inference loop",
    "ch05-oom": "chapter 5: peak memory against batch size, and the largest batch under a memory cap",
    "ch05-memory-snapshot": "chapter 5: a memory snapshot read for what holds the memory",
    "ch06-fp16-smallcnn": "chapter 6: float16 autocast + GradScaler against float32 on SmallCNN(width=64)",
    "ch06-launch-bound": "chapter 6: why SmallCNN gains little: the share of its step that does not grow with batch",
    "ch06-speed-levers": "chapter 6: mixed precision, TF32, channels_last and cudnn.benchmark on SmallCNN and resnet18",
    "ch08-reduce-overhead": "chapter 8: torch.compile mode='reduce-overhead' against the default mode",
}
_HEADER = ("format", "gpu", "torch", "cuda", "date", "machine", "sources", "lessons")
_FIGURE = {"what": str, "value": (int, float), "unit": str, "source": str}
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True)
class RecordedFigure:
    """One figure of a recorded run, with the run's labels."""

    lesson: str
    what: str
    value: int | float
    unit: str
    source: str       # the run's description of where the figure came from
    label: str        # "NVIDIA H200, torch 2.11.0+cu130, 2026-12-04"


def _check_lesson(lesson_id: str) -> None:
    if lesson_id not in LESSONS:
        raise ValueError(f"unknown GPU lesson id {lesson_id!r}; known: {', '.join(sorted(LESSONS))}")


def validate_run(run: object, where: str = "a GPU run") -> None:
    """Raise ValueError naming the first field of `run` (a parsed record file) that is missing or malformed."""
    if not isinstance(run, dict):
        raise ValueError(f"{where}: a record is a JSON object, got {type(run).__name__}")
    missing = [key for key in _HEADER if key not in run]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    if run["format"] != FORMAT:
        raise ValueError(f"{where}: format {run['format']!r}, this ptlab reads format {FORMAT}")
    for key in ("gpu", "torch", "cuda", "machine"):
        if not isinstance(run[key], str) or not run[key].strip():
            raise ValueError(f"{where}: {key} must be a non-empty string, got {run[key]!r}")
    if not isinstance(run["date"], str) or not _DATE.match(run["date"]):
        raise ValueError(f"{where}: date must be YYYY-MM-DD, got {run['date']!r}")
    if not isinstance(run["sources"], dict) or not all(isinstance(v, str) for v in run["sources"].values()):
        raise ValueError(f"{where}: sources must map a short name to a description")
    if not isinstance(run["lessons"], dict):
        raise ValueError(f"{where}: lessons must map a lesson id to a list of figures")
    for lesson, figures in run["lessons"].items():
        if lesson not in LESSONS:
            raise ValueError(f"{where}: unknown lesson id {lesson!r}; known: {', '.join(sorted(LESSONS))}")
        if not isinstance(figures, list) or not figures:
            raise ValueError(f"{where}: lessons[{lesson!r}] must be a non-empty list of figures")
        for i, figure in enumerate(figures):
            at = f"{where}: lessons[{lesson!r}][{i}]"
            if not isinstance(figure, dict) or set(figure) != set(_FIGURE):
                raise ValueError(f"{at} must have exactly the keys {', '.join(_FIGURE)}")
            for key, kind in _FIGURE.items():
                if not isinstance(figure[key], kind) or isinstance(figure[key], bool):
                    raise ValueError(f"{at}: {key} has the wrong type ({type(figure[key]).__name__})")
            if figure["source"] not in run["sources"]:
                raise ValueError(f"{at}: source {figure['source']!r} is not one of the run's sources")


def load_runs(folder: str | Path | None = None) -> list[dict]:
    """Every recorded run in `folder` (default: the checkout's data/gpu_runs), validated, newest first.

    The file PTLAB_GPU_RECORD names is left out: it is a run still being written.
    """
    folder = Path(folder) if folder is not None else RUNS_DIR
    if not folder.is_dir():
        return []
    in_progress = os.environ.get(RECORD_ENV, "").strip()
    skip = Path(in_progress).resolve() if in_progress else None
    runs = []
    for path in sorted(folder.glob("*.json")):
        if skip is not None and path.resolve() == skip:
            continue
        try:
            run = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path.name}: not valid JSON ({err})") from None
        validate_run(run, path.name)
        runs.append(run)
    return sorted(runs, key=lambda r: r["date"], reverse=True)


def _label(run: dict) -> str:
    return f"{run['gpu']}, torch {run['torch']}, {run['date']}"


def recorded_figures(lesson_id: str, folder: str | Path | None = None) -> list[RecordedFigure]:
    """A lesson's figures from every recorded run (newest run first); [] where none recorded it yet."""
    _check_lesson(lesson_id)
    return [RecordedFigure(lesson_id, f["what"], f["value"], f["unit"], run["sources"][f["source"]], _label(run))
            for run in load_runs(folder) for f in run["lessons"].get(lesson_id, [])]


def _shown(value: int | float, unit: str) -> str:
    if isinstance(value, int) or abs(value) >= 1000:
        number = f"{round(value):,}"
    else:
        number = f"{value:.4g}"
    return f"{number}x" if unit == "x" else f"{number} {unit}"


def recorded(lesson_id: str, folder: str | Path | None = None) -> str:
    """A lesson's recorded GPU figures as text, each run labelled with its GPU, torch version and date."""
    figures = recorded_figures(lesson_id, folder)
    if not figures:
        return (f"no GPU run recorded for {lesson_id} yet: on a CUDA machine, the GPU cells add their figures to "
                f"the file the environment variable {RECORD_ENV} names")
    blocks: dict[str, list[RecordedFigure]] = {}
    for figure in figures:
        blocks.setdefault(figure.label, []).append(figure)
    lines = []
    for label, group in blocks.items():
        lines.append(f"recorded on {label} (not measured here):")
        width = max(len(f.what) for f in group) + 2
        lines += [f"  {f.what:<{width}}{_shown(f.value, f.unit)}" for f in group]
        for source in dict.fromkeys(f.source for f in group):
            lines.append(f"  from {source}")
    return "\n".join(lines)


def gpu_environment(device: torch.device | str = "cuda") -> dict:
    """The header of a new record for this machine's GPU: name, compute capability, torch, CUDA, date, machine."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"a GPU record needs a CUDA device; got {device} (torch.cuda.is_available() is "
                           f"{torch.cuda.is_available()})")
    major, minor = torch.cuda.get_device_capability(device)
    machine = (f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), Python "
               f"{platform.python_version()}, compute capability {major}.{minor}")
    return {"format": FORMAT, "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
            "cuda": torch.version.cuda or "unknown", "date": datetime.date.today().isoformat(),
            "machine": machine, "sources": {}, "lessons": {}}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on path + '.lock' (where fcntl exists): notebooks run in parallel lanes append too."""
    if fcntl is None:
        yield
        return
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def add_figures(path: str | Path, header: dict, lesson_id: str, figures: dict[str, tuple[float, str]],
                source: str) -> dict:
    """Add a lesson's figures ({what: (value, unit)}) to the record at `path`, made from `header` if absent.

    The lesson's figures from this source replace any it had; the file is rewritten atomically.
    """
    _check_lesson(lesson_id)
    if not isinstance(source, str) or not source.strip():
        raise ValueError("source must say where the figures come from, e.g. 'course cell, chapter 6'")
    if not isinstance(figures, dict) or not figures:
        raise ValueError("figures must be a non-empty dict {what: (value, unit)}")
    rows = []
    for what, pair in figures.items():
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], str)
                and isinstance(pair[0], (int, float)) and not isinstance(pair[0], bool)):
            raise ValueError(f"figures[{what!r}] must be a (number, unit) pair, got {pair!r}")
        rows.append({"what": what, "value": pair[0], "unit": pair[1], "source": source})
    path = Path(path)
    with _locked(path):
        run = json.loads(path.read_text(encoding="utf-8")) if path.exists() and path.stat().st_size else dict(header)
        if (run["gpu"], run["torch"]) != (header["gpu"], header["torch"]):
            raise ValueError(f"{path} records {run['gpu']} with torch {run['torch']}; this is {header['gpu']} "
                             f"with torch {header['torch']}: write a new file")
        run["sources"] = {**run["sources"], source: source}
        kept = [f for f in run["lessons"].get(lesson_id, []) if f["source"] != source]
        run["lessons"] = {**run["lessons"], lesson_id: kept + rows}
        validate_run(run, path.name)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as f:
            f.write(json.dumps(run, indent=2, ensure_ascii=False) + "\n")
        os.replace(f.name, path)
    return run


def record_figures(lesson_id: str, figures: dict[str, tuple[float, str]], source: str,
                   device: torch.device | str = "cuda") -> Path | None:
    """Where PTLAB_GPU_RECORD names a file, add this GPU's figures for the lesson to it and return its path.

    Without the variable: nothing is written and None is returned (the lesson id is still checked).
    """
    _check_lesson(lesson_id)
    target = os.environ.get(RECORD_ENV, "").strip()
    if not target:
        return None
    add_figures(target, gpu_environment(device), lesson_id, figures, source)
    return Path(target)
