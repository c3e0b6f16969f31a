"""Registered pitfalls: one module per topic, discovered automatically."""
from __future__ import annotations

import importlib
import pkgutil

from .registry import Outcome, Pitfall, format_figure, pitfall, registered

__all__ = ["Outcome", "Pitfall", "pitfall", "all_pitfalls", "get_pitfall", "run_pitfall", "format_figure"]

_TOPIC_MODULES_SKIPPED = {"registry"}


def _load_topics() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _TOPIC_MODULES_SKIPPED and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def all_pitfalls(chapter: int | None = None) -> list[Pitfall]:
    """Every pitfall of the course (or of one chapter), ordered by chapter then registration."""
    _load_topics()
    records = list(registered().values())
    if chapter is not None:
        records = [p for p in records if p.chapter == chapter]
    return sorted(records, key=lambda p: p.chapter)


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

    def __init__(self, record: Pitfall, buggy: Outcome, fixed: Outcome):
        self.record, self.buggy, self.fixed = record, buggy, fixed

    def table(self) -> str:
        """Figures of both runs side by side, as fixed-width text."""
        bug, fix = self.buggy.formatted_figures(), self.fixed.formatted_figures()
        names = list(dict.fromkeys([*bug, *fix]))
        width = max([len(n) for n in names] + [len("symptom shows")]) + 2
        col = max([len(v) for v in [*bug.values(), *fix.values()]] + [8]) + 2
        lines = [f"{self.record.id}", f"  {'':<{width}}{'bug on':<{col}}fixed"]
        lines += [f"  {n:<{width}}{bug.get(n, '-'):<{col}}{fix.get(n, '-')}" for n in names]
        lines.append(f"  {'symptom shows':<{width}}{str(self.buggy.broken):<{col}}{self.fixed.broken}")
        return "\n".join(lines)

    def plot(self):
        """Both runs' series in one figure (None when the pitfall has no series)."""
        from ..plots import plot_series

        return plot_series({"bug on": self.buggy, "fixed": self.fixed}, title=self.record.title)

    def __repr__(self) -> str:
        return self.table()

    def _ipython_display_(self) -> None:
        # compare_pitfall() already printed the table; `print(comparison)` shows it again.
        pass


def compare_pitfall(pitfall_id: str, plot: bool = False) -> PitfallComparison:
    """Run a pitfall buggy and fixed, print the figures side by side, and assert the contract."""
    from ..claims import claim

    record = get_pitfall(pitfall_id)
    comparison = PitfallComparison(record, record.run(buggy=True), record.run(buggy=False))
    print(comparison.table())
    claim(f"bug on shows the symptom ({record.symptom})", comparison.buggy.broken)
    claim("fixed code does not", not comparison.fixed.broken)
    if plot:
        import matplotlib.pyplot as plt

        fig = comparison.plot()
        if fig is not None:
            plt.show()
    return comparison


__all__ += ["compare_pitfall", "PitfallComparison"]
