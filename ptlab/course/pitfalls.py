"""Registered pitfalls: every `pitfalls*.py` of ptlab/lessons/chNN_*/, discovered automatically."""
from __future__ import annotations

import difflib

from ptlab.claims import Check, ClaimFailed
from ptlab.course.pitfall_record import (BUG_ON, FIXED, Outcome, Pitfall, PitfallUnavailable, figure_table, pitfall,
                                         registered, run_claims, run_text)
from ptlab.course.topics import import_lesson_modules

__all__ = ["Check", "Outcome", "Pitfall", "PitfallUnavailable", "pitfall", "all_pitfalls", "get_pitfall",
           "run_pitfall", "compare_pitfall", "nearest_ids", "PitfallComparison"]


def _load_topics() -> None:
    import_lesson_modules("pitfalls")


def all_pitfalls(chapter: int | None = None) -> list[Pitfall]:
    """Every pitfall of the course (or of one chapter), ordered by chapter, then lesson module, then source line.

    The order depends on the source alone, not on which module a session happened to import first.
    """
    _load_topics()
    records = list(registered().values())
    if chapter is not None:
        records = [p for p in records if p.chapter == chapter]
    return sorted(records, key=_source_order)


def _source_order(record: Pitfall) -> tuple[int, str, int]:
    code = getattr(record.reproduce, "__code__", None)
    return (record.chapter, getattr(record.reproduce, "__module__", "") or "",
            code.co_firstlineno if code is not None else 0)


def nearest_ids(pitfall_id: str, n: int = 3) -> list[str]:
    """The registered ids closest in spelling to `pitfall_id` (difflib), best first; empty when none is close."""
    _load_topics()
    return difflib.get_close_matches(pitfall_id, list(registered()), n=n, cutoff=0.6)


def get_pitfall(pitfall_id: str) -> Pitfall:
    """The pitfall with this id; a KeyError names the nearest ids, then lists the known ones, when there is none."""
    if not isinstance(pitfall_id, str):
        raise TypeError(f"pitfall_id must be a str such as 'missing-zero-grad', got {type(pitfall_id).__name__}")
    _load_topics()
    records = registered()
    if pitfall_id not in records:
        nearest = nearest_ids(pitfall_id)
        guess = f" (did you mean {' or '.join(map(repr, nearest))}?)" if nearest else ""
        raise KeyError(f"no pitfall with id {pitfall_id!r}{guess}; known ids: {', '.join(sorted(records))}")
    return records[pitfall_id]


def run_pitfall(pitfall_id: str, buggy: bool = True) -> Outcome:
    """Run one pitfall's reproduction with the bug on or off."""
    return get_pitfall(pitfall_id).run(buggy=buggy)


class PitfallComparison:
    """A pitfall run both ways; printing it gives a side-by-side table of the figures."""

    def __init__(self, record: Pitfall, buggy: Outcome, fixed: Outcome):
        self.record, self.buggy, self.fixed = record, buggy, fixed

    @property
    def runs(self) -> dict[str, Outcome]:
        """{"bug on": the buggy run's outcome, "fixed": the fixed run's}."""
        return {BUG_ON: self.buggy, FIXED: self.fixed}

    def table(self) -> str:
        """The pitfall's id, then the figures of both runs side by side, as fixed-width text."""
        return f"{self.record.id}\n{figure_table(self.runs)}"

    def plot(self):
        """Both runs' series in one figure (None when the pitfall has no series)."""
        from ptlab.plots import plot_series

        return plot_series(self.runs, title=self.record.title)

    def __repr__(self) -> str:
        return self.table()

    def _ipython_display_(self) -> None:
        # compare_pitfall() already printed the table; `print(comparison)` shows it again.
        pass


def compare_pitfall(pitfall_id: str, plot: bool = False) -> PitfallComparison | None:
    """Run a pitfall buggy and fixed, print the figures side by side, and assert each check both ways.

    With the bug on, every check must hold (the symptom shows); fixed, none may (it is gone). A pitfall
    that cannot run on this machine prints why ("skipped: ...") and returns None.
    """
    record = get_pitfall(pitfall_id)
    print(record.id, flush=True)          # the table's first line, shown at once: both runs can take seconds
    skipped = record.skipped_text()
    if skipped is not None:               # it needs what this machine lacks: say so, claim nothing
        print(skipped)
        return None
    if record.in_subprocesses:            # both ways at once: each only waits for its own processes
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=2) as pool:
            buggy, fixed = pool.map(lambda bug: record.run(buggy=bug), (True, False))
    else:
        buggy, fixed = record.run(buggy=True), record.run(buggy=False)
    comparison = PitfallComparison(record, buggy, fixed)
    print(run_text(comparison.runs))      # the figures, then a ✔ line per check (✘ where a run is not as it should)
    untrue = [statement for statement, true in run_claims(comparison.runs) if not true]
    if untrue:
        raise ClaimFailed(f"claim does not hold on this machine: {untrue[0]}")
    if plot:
        from ptlab.plots import show_figure

        fig = comparison.plot()
        if fig is not None:
            show_figure(fig)
    return comparison


