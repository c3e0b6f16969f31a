"""Registered pitfalls: every `pitfalls*.py` of ptlab/lessons/chNN_*/, discovered automatically."""
from __future__ import annotations

from ptlab.claims import MEASURED, Check, claim
from ptlab.course.pitfall_record import Outcome, Pitfall, PitfallUnavailable, pitfall, registered
from ptlab.course.topics import import_lesson_modules

__all__ = ["Check", "Outcome", "Pitfall", "PitfallUnavailable", "pitfall", "all_pitfalls", "get_pitfall",
           "run_pitfall", "compare_pitfall",
           "PitfallComparison"]


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


def get_pitfall(pitfall_id: str) -> Pitfall:
    """The pitfall with this id; a KeyError lists the known ids when there is none."""
    _load_topics()
    records = registered()
    if pitfall_id not in records:
        known = ", ".join(sorted(records))
        raise KeyError(f"no pitfall with id {pitfall_id!r}; known ids: {known}")
    return records[pitfall_id]


def run_pitfall(pitfall_id: str, buggy: bool = True) -> Outcome:
    """Run one pitfall's reproduction with the bug on or off."""
    return get_pitfall(pitfall_id).run(buggy=buggy)


class PitfallComparison:
    """A pitfall run both ways; printing it gives a side-by-side table of the figures."""

    # Columns are as wide as the exact values need, never the measured ones, so that a table lines up
    # the same way on every machine (nbval masks a measured figure together with its padding).
    MEASURED_WIDTH = 12

    def __init__(self, record: Pitfall, buggy: Outcome, fixed: Outcome):
        self.record, self.buggy, self.fixed = record, buggy, fixed

    def table(self) -> str:
        """Figures of both runs side by side, as fixed-width text."""
        bug, fix = self.buggy.formatted_figures(), self.fixed.formatted_figures()
        names = list(dict.fromkeys([*bug, *fix]))
        width = max(len(n) for n in names) + 2 if names else 2
        exact_widths = [len(v) for v in [*bug.values(), *fix.values()] if not v.startswith(MEASURED)]
        col = max(exact_widths + [self.MEASURED_WIDTH, len("bug on")]) + 2
        lines = [f"{self.record.id}", f"  {'':<{width}}{'bug on':<{col}}fixed"]
        lines += [f"  {n:<{width}}{bug.get(n, '-'):<{col}}{fix.get(n, '-')}".rstrip() for n in names]
        return "\n".join(lines)

    def verdict_lines(self) -> list[str]:
        """One line per check: with the bug on each holds, fixed none does."""
        return ([f"bug on: {c.line()}" for c in self.buggy.checks]
                + [f"fixed: {c.line()}" for c in self.fixed.checks])

    def plot(self):
        """Both runs' series in one figure (None when the pitfall has no series)."""
        from ptlab.plots import plot_series

        return plot_series({"bug on": self.buggy, "fixed": self.fixed}, title=self.record.title)

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
    reason = record.unavailable_reason()
    if reason is not None:                # it needs what this machine lacks: say so, claim nothing
        print(f"skipped: {reason}")
        return None
    if record.in_subprocesses:            # both ways at once: each only waits for its own processes
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=2) as pool:
            buggy, fixed = pool.map(lambda bug: record.run(buggy=bug), (True, False))
    else:
        buggy, fixed = record.run(buggy=True), record.run(buggy=False)
    comparison = PitfallComparison(record, buggy, fixed)
    print(comparison.table().split("\n", 1)[1])
    for check in comparison.buggy.checks:
        claim(f"bug on: {check.line()}", check.holds)
    for check in comparison.fixed.checks:
        claim(f"fixed: {check.line()}", not check.holds)
    if plot:
        from ptlab.plots import show_figure

        fig = comparison.plot()
        if fig is not None:
            show_figure(fig)
    return comparison


