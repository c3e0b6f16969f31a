"""Small matplotlib figures shared by the widgets and the notebooks."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:   # matplotlib itself is imported when a figure is drawn: a torchrun worker that imports
    from matplotlib.figure import Figure   # ptlab.train to train never pays its ~0.5 s import


class HasSeries(Protocol):
    """Anything with named series to plot and an x-axis label (a pitfall's Outcome, say)."""

    series: dict[str, list[float]]
    x_label: str

BUGGY_COLOUR = "#c0392b"
FIXED_COLOUR = "#27ae60"


def plot_series(outcomes: dict[str, HasSeries], title: str = "", size: tuple[float, float] = (5.5, 3.0)) -> Figure | None:
    """Plot every series of each labelled outcome on one axis per series name; None if nothing to plot."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    names = sorted({name for o in outcomes.values() for name in o.series})
    if not names:
        return None
    # A bare Figure, not pyplot: the inline backend never shows or closes it behind a widget's back.
    fig = Figure(figsize=(size[0] * len(names), size[1]))
    axes = fig.subplots(1, len(names), squeeze=False)
    for ax, name in zip(axes[0], names):
        for label, outcome in outcomes.items():
            values = outcome.series.get(name)
            if values:
                colour = BUGGY_COLOUR if label.startswith("bug") else FIXED_COLOUR
                ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3, label=label, color=colour)
                ax.set_xlabel(outcome.x_label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and epochs are whole numbers
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def show_figure(fig: Figure) -> None:
    """Display a Figure as a PNG in the notebook, whatever matplotlib backend the kernel has (or none)."""
    import io

    from IPython.display import Image, display

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.dpi, bbox_inches="tight")
    display(Image(data=buffer.getvalue(), format="png"))
