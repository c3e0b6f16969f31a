"""An experiment log: every run appends its config, final metrics, curves and checkpoint to one JSON-lines file.

"Record every experiment" made small: `log_run(...)` after each run, `load_runs()` to read them back,
`compare_runs(...)` for a table sorted by any metric (the config keys that differ between runs become
columns), and `plot_runs(...)` to overlay their curves. One line per run, appended and flushed, so a
crash loses at most the run that was being written, never the earlier ones nor the later ones: the next
record starts on a new line, and load_runs skips an unreadable line (cut JSON, cut UTF-8) with one
warning that names it and counts the skipped lines.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ptlab.claims import show
from ptlab.plots import notebook_figure

LOG_NAME = "runs.jsonl"


@dataclass(frozen=True)
class Run:
    """One logged run."""

    name: str
    config: dict[str, Any]
    metrics: dict[str, float]
    curves: dict[str, list[float]] = field(default_factory=dict)
    checkpoint: str | None = None
    time: str = ""


def _plain(value: Any, where: str) -> Any:
    """JSON-ready copies of numbers, strings, lists and dicts; a clear error for anything else."""
    if hasattr(value, "item") and callable(value.item):  # a 0-d tensor or numpy scalar
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # JSON has no NaN or inf
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, Path):
        return value.as_posix()
    raise TypeError(f"{where}: {type(value).__name__} cannot go into the run log; use numbers, strings, "
                    "lists and dicts")


def _curves(history: Any) -> dict[str, list[float]]:
    if history is None:
        return {}
    curves = history.as_dict() if hasattr(history, "as_dict") else dict(history)
    curves.pop("seconds", None)  # wall time differs on every machine; the log compares runs, not machines
    return {k: _plain(list(v), f"history.{k}") for k, v in curves.items() if isinstance(v, (list, tuple))}


def log_run(config: dict[str, Any], metrics: dict[str, float], *, history: Any = None,
            checkpoint: str | Path | None = None, runs_dir: str | Path = "runs", name: str | None = None) -> Run:
    """Append one run (config, final metrics, curves from a History or dict, checkpoint path) to runs/runs.jsonl."""
    if not isinstance(config, dict) or not isinstance(metrics, dict):
        raise TypeError("log_run needs config and metrics as dicts, e.g. log_run({'lr': 1e-3}, {'val_acc': 0.9})")
    folder = Path(runs_dir)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / LOG_NAME
    existing = len(load_runs(folder)) if log.exists() else 0
    run = Run(name=name or f"run-{existing + 1:03d}", config=_plain(config, "config"),
              metrics=_plain(metrics, "metrics"), curves=_curves(history),
              checkpoint=Path(checkpoint).as_posix() if checkpoint is not None else None,
              time=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    line = json.dumps(run.__dict__, ensure_ascii=False) + "\n"
    with open(log, "a+b") as handle:  # writes go to the end whatever the position; "+" lets us read the end
        if handle.seek(0, os.SEEK_END) > 0:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                line = "\n" + line  # a crash cut the last line short: this record must not continue it
        handle.write(line.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())
    return run


def load_runs(runs_dir: str | Path = "runs") -> list[Run]:
    """Every run in runs/runs.jsonl, oldest first; unreadable lines (cut by a crash) are skipped with one warning."""
    log = Path(runs_dir) / LOG_NAME
    if not log.exists():
        raise FileNotFoundError(f"no run log at {log}: log_run(...) creates it")
    runs, bad = [], []
    for number, raw in enumerate(log.read_bytes().split(b"\n"), start=1):  # only "\n" ends a record
        if not raw.strip():
            continue
        try:
            runs.append(Run(**json.loads(raw.decode("utf-8"))))
        except (UnicodeDecodeError, json.JSONDecodeError, TypeError) as err:
            bad.append((number, err))
    if bad:
        (number, err), others = bad[0], [n for n, _ in bad[1:]]
        more = f", nor are lines {others}" if others else ""
        warnings.warn(f"{log}:{number} is not a complete run record ({err}){more}; skipped {len(bad)} unreadable "
                      f"line{'s' * (len(bad) > 1)}, read {len(runs)} runs", stacklevel=2)
    return runs


class RunTable:
    """Runs side by side: name, the config keys that differ, and the metrics; sorted by one metric or config key."""

    def __init__(self, runs: list[Run], sort_by: str | None = None, descending: bool = True):
        self.runs = list(runs)
        keys = sorted({k for r in runs for k in r.config})
        self.config_keys = [k for k in keys if len({json.dumps(r.config.get(k)) for r in runs}) > 1] or keys
        self.metric_keys = list(dict.fromkeys(k for r in runs for k in r.metrics))
        if sort_by is not None:
            if sort_by not in self.metric_keys and sort_by not in keys:
                raise KeyError(f"cannot sort by {sort_by!r}: metrics are {self.metric_keys}, config keys {keys}")
            def key(r: Run):  # finite numbers in the order asked for, then other values by their text, then none
                value = r.metrics.get(sort_by, r.config.get(sort_by))
                if isinstance(value, int) or isinstance(value, float) and math.isfinite(value):
                    return (0, -value if descending else value, "")
                return (2 if value is None else 1, 0, str(value))  # "nan", "inf" and strings, then missing
            self.runs.sort(key=key)

    def rows(self) -> list[list[str]]:
        """Header row, then one row of text per run."""

        header = ["run", *self.config_keys, *self.metric_keys]
        body = [[r.name, *[str(r.config.get(k, "-")) for k in self.config_keys],
                 *[show(r.metrics[k]) if k in r.metrics else "-" for k in self.metric_keys]] for r in self.runs]
        return [header, *body]

    def __repr__(self) -> str:
        rows = self.rows()
        widths = [max(len(row[i]) for row in rows) + 2 for i in range(len(rows[0]))]
        return "\n".join("".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)

    def _repr_html_(self) -> str:
        import html

        header, *body = self.rows()
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def compare_runs(runs: list[Run] | str | Path = "runs", sort_by: str | None = None,
                 descending: bool | None = None) -> RunTable:
    """A table of runs (a list, or the runs folder), sorted by a metric or config key (not-finite values last).

    Best first by default: ascending for a key that names a loss or an error, descending for anything else.
    """
    if not isinstance(runs, list):
        runs = load_runs(runs)
    if descending is None:
        descending = not (sort_by and any(word in sort_by.lower() for word in ("loss", "error")))
    return RunTable(runs, sort_by=sort_by, descending=descending)


def plot_runs(runs: list[Run] | str | Path = "runs", curve: str = "val_loss"):
    """One curve of every run on one axis, labelled by run name (a matplotlib Figure)."""
    from matplotlib.ticker import MaxNLocator

    if not isinstance(runs, list):
        runs = load_runs(runs)
    having = [r for r in runs if curve in r.curves]
    if not having:
        known = sorted({k for r in runs for k in r.curves})
        raise KeyError(f"no run has a {curve!r} curve; curves logged: {known}")
    fig = notebook_figure(figsize=(6, 3.4), layout="constrained")
    ax = fig.subplots()
    for r in having:
        values = [float(v) for v in r.curves[curve]]
        ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3, label=r.name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_title(curve)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig
