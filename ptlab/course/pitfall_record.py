"""The pitfall record: buggy vs fixed code in one function, and the measured outcome."""
from __future__ import annotations

import inspect
import re
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from ptlab.claims import MEASURED, Check, show
from ptlab.core import kept_random_state
from ptlab.course.topics import refuse_second_id

Number = int | float
BUG_ON, FIXED = "bug on", "fixed"     # the two ways a pitfall runs, as every view labels them
# Table columns are as wide as the exact values need, never the measured ones, so that a table lines up the same
# way on every machine (nbval masks a measured figure together with its padding).
MEASURED_WIDTH = 12

_ID_PATTERN = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_REGISTRY: dict[str, "Pitfall"] = {}


@dataclass(frozen=True)
class Outcome:
    """What one run measured: named figures, series to plot, and the checks that decide the symptom.

    The symptom shows (`broken`) when every check holds. A check is a statement with its measured
    value and its bound, so the verdict prints exactly what was asserted. Figures and check values
    follow one display rule (`ptlab.claims.show`): floats are measured ('≈', masked by nbval),
    ints, bools and strings are exact.
    """

    figures: dict[str, Number | str]
    checks: list[Check]
    series: dict[str, list[float]] = field(default_factory=dict)
    x_label: str = "step"
    levels: dict[str, dict[str, float]] = field(default_factory=dict)   # lines drawn across a series' plot

    def __post_init__(self) -> None:
        if not self.checks or not all(isinstance(c, Check) for c in self.checks):
            raise TypeError("Outcome.checks must be a non-empty list of ptlab.claims.Check")
        for name, values in self.series.items():
            if not all(isinstance(v, (int, float)) for v in values):
                raise TypeError(f"Outcome.series[{name!r}] must hold plain numbers (call .item() on tensors)")

    @property
    def broken(self) -> bool:
        """The symptom shows: every check holds."""
        return all(check.holds for check in self.checks)

    def formatted_figures(self) -> dict[str, str]:
        """Figures as text by the one display rule: floats measured ('≈'), everything else exact."""
        return {name: show(value) for name, value in self.figures.items()}


class PitfallUnavailable(RuntimeError):
    """A pitfall's reproduction cannot run on this machine (its record's `unavailable` says why)."""


@dataclass(frozen=True)
class Pitfall:
    """A registered pitfall: who it is, what goes wrong, why, how to catch it, and its reproduction."""

    id: str
    chapter: int
    title: str
    symptom: str
    why: str
    catch: str
    reproduce: Callable[[bool], Outcome]
    # The reproduction only starts other processes and reads what they did: nothing of this process's torch
    # state is used, so compare_pitfall may run the buggy and the fixed way at the same time.
    in_subprocesses: bool = False
    # Why the reproduction cannot run on this machine (it needs Linux, fork, ...), or None where it can.
    unavailable: Callable[[], str | None] | None = None

    def unavailable_reason(self) -> str | None:
        """Why this pitfall cannot run here, or None when it can."""
        return self.unavailable() if self.unavailable is not None else None

    def skipped_text(self) -> str | None:
        """What every view prints where this pitfall cannot run here ('skipped: <why>'), or None where it can."""
        reason = self.unavailable_reason()
        return None if reason is None else f"skipped: {reason}"

    def run(self, buggy: bool = True) -> Outcome:
        """Run the reproduction with the bug on (buggy=True) or fixed, and return what it measured.

        Reproductions seed what they use; the caller's torch (CPU and CUDA), NumPy and `random`
        states are restored afterwards, so running a pitfall never changes the learner's own results.
        A pitfall that cannot run on this machine raises PitfallUnavailable, which says why.
        """
        reason = self.unavailable_reason()
        if reason is not None:
            raise PitfallUnavailable(f"pitfall {self.id!r} cannot run here: {reason}")
        with preserved_random_state():
            outcome = self.reproduce(buggy=bool(buggy))
        if not isinstance(outcome, Outcome):
            raise TypeError(f"pitfall {self.id!r} returned {type(outcome).__name__}, expected Outcome")
        return outcome

    @property
    def source(self) -> str:
        """The reproduction's source code, as the learner reads it (decorator left out)."""
        lines = textwrap.dedent(inspect.getsource(self.reproduce)).splitlines()
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))
        return "\n".join(lines[start:])

    def marked_lines(self) -> list[tuple[str, str | None]]:
        """Each source line with its marker: 'BUG', 'FIX' or None."""
        return [(line, _marker(line)) for line in self.source.splitlines()]

    def summary(self) -> dict[str, object]:
        """The catalogue entry (everything but the code), JSON-ready."""
        return {"id": self.id, "chapter": self.chapter, "title": self.title, "symptom": self.symptom,
                "why": self.why, "catch": self.catch}


def run_claims(runs: dict[str, Outcome]) -> list[tuple[str, bool]]:
    """Each check of each run as a statement and whether it is true: with the bug on it holds, fixed it does not."""
    return [(f"{label}: {check.line()}", check.holds == (label == BUG_ON))
            for label, outcome in runs.items() for check in outcome.checks]


def run_text(runs: dict[str, Outcome]) -> str:
    """One or both runs ({"bug on": outcome, "fixed": outcome}) as every view shows them: the figures side by side,
    then one line per check, ✔ where the run shows what it should (✘ where not)."""
    return "\n".join([figure_table(runs)] + [f"{'✔' if true else '✘'} {statement}"
                                            for statement, true in run_claims(runs)])


def figure_table(runs: dict[str, Outcome]) -> str:
    """The runs' figures side by side as fixed-width text, a column per run, '-' where a run lacks a figure."""
    shown = {label: outcome.formatted_figures() for label, outcome in runs.items()}
    names = list(dict.fromkeys(name for figures in shown.values() for name in figures))
    width = max(len(n) for n in names) + 2 if names else 2
    exact = [len(v) for figures in shown.values() for v in figures.values() if not v.startswith(MEASURED)]
    col = max(exact + [MEASURED_WIDTH] + [len(label) for label in runs]) + 2
    labels = list(runs)

    def line(first: str, cells: list[str]) -> str:
        return f"  {first:<{width}}" + "".join(f"{c:<{col}}" for c in cells[:-1]) + cells[-1]

    return "\n".join([line("", labels)] + [line(n, [shown[label].get(n, "-") for label in labels]).rstrip()
                                          for n in names])


@contextmanager
def preserved_random_state():
    """Restore torch's CPU and CUDA generators, NumPy's global one and `random` on exit."""
    import random

    import numpy as np
    import torch

    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if torch.cuda.is_initialized() else []
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        with kept_random_state(devices):
            yield
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)


def _marker(line: str) -> str | None:
    comment = line.split("#", 1)[1] if "#" in line else ""
    for tag in ("BUG", "FIX"):
        if re.match(rf"\s*{tag}\b", comment):
            return tag
    return None


def pitfall(*, id: str, chapter: int, title: str, symptom: str, why: str, catch: str, in_subprocesses: bool = False,
            unavailable: Callable[[], str | None] | None = None):
    """Register a reproduction `fn(buggy: bool) -> Outcome` as a pitfall record (in_subprocesses and
    unavailable: see Pitfall)."""

    def register(fn: Callable[[bool], Outcome]) -> Callable[[bool], Outcome]:
        if not _ID_PATTERN.match(id):
            raise ValueError(f"pitfall id {id!r} must be lowercase words joined by '-'")
        refuse_second_id(_REGISTRY, "pitfall", id, fn, lambda p: p.reproduce)
        if "buggy" not in inspect.signature(fn).parameters:
            raise TypeError(f"pitfall {id!r}: the reproduction must take a `buggy` argument")
        record = Pitfall(id, chapter, title, symptom, " ".join(why.split()), " ".join(catch.split()), fn,
                         bool(in_subprocesses), unavailable)
        markers = {m for _, m in record.marked_lines()}
        if not {"BUG", "FIX"} <= markers:
            raise ValueError(f"pitfall {id!r}: mark the differing lines with '# BUG' and '# FIX' comments")
        _REGISTRY[id] = record
        return fn

    return register


def registered() -> dict[str, Pitfall]:
    """Every pitfall registered so far, by id (topic modules register on import)."""
    return dict(_REGISTRY)
