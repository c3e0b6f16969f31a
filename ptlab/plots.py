"""Small matplotlib figures shared by the widgets and the notebooks."""
from __future__ import annotations

import itertools

import functools
import textwrap
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:   # matplotlib itself is imported when a figure is drawn: a torchrun worker that imports
    from matplotlib.figure import Figure   # ptlab.train to train never pays its ~0.5 s import


class HasSeries(Protocol):
    """Anything with named series to plot and an x-axis label (a pitfall's Outcome, say)."""

    series: dict[str, list[float]]
    x_label: str

BUGGY_COLOUR = "#c0392b"
FIXED_COLOUR = "#27ae60"


def plot_series(outcomes: dict[str, HasSeries], title: str = "",
                size: tuple[float, float] = (5.5, 3.0)) -> Figure | None:
    """Plot every series of each labelled outcome on one axis per series name, with the horizontal lines an outcome's
    `levels` names ({series: {label: y}}, if it has any); None if nothing to plot."""
    from matplotlib.ticker import MaxNLocator

    names = sorted({name for o in outcomes.values() for name in o.series})
    if not names:
        return None
    # A bare Figure, not pyplot: the inline backend never shows or closes it behind a widget's back.
    fig = notebook_figure(figsize=(size[0] * len(names), size[1]))
    axes = fig.subplots(1, len(names), squeeze=False)
    for ax, name in zip(axes[0], names):
        for label, outcome in outcomes.items():
            values = outcome.series.get(name)
            if values:
                # The buggy run dashed and on top: where both runs take the same steps, both stay visible.
                buggy = label.startswith("bug")
                style = dict(linestyle="--", linewidth=1.5, zorder=3) if buggy else dict(linewidth=4, alpha=0.5)
                ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3, label=label,
                        color=BUGGY_COLOUR if buggy else FIXED_COLOUR, **style)
                ax.set_xlabel(outcome.x_label)
        levels = {text: y for o in outcomes.values() for text, y in getattr(o, "levels", {}).get(name, {}).items()}
        for (text, y), style in zip(levels.items(), itertools.cycle((":", "-.", (0, (1, 3))))):  # every level drawn
            ax.axhline(y, color="0.35", linestyle=style, linewidth=1.2, label=text, zorder=1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and epochs are whole numbers
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    if title:   # wrapped to the figure's width (about 11 characters an inch), not cut off at its edges
        fig.suptitle(textwrap.fill(title, width=int(size[0] * len(names) * 11)))
    fig.tight_layout()
    return fig


@functools.cache
def _notebook_figure_class() -> type:
    from matplotlib.figure import Figure

    class NotebookFigure(Figure):
        """A bare matplotlib Figure that a notebook draws as a PNG (show_figure) when a cell ends with it."""

        def _ipython_display_(self) -> None:
            # Without this, a Figure outside pyplot shows in a notebook only as '<Figure size 900x340 with 2 Axes>'.
            show_figure(self)

    NotebookFigure.__module__ = __name__      # pickled as ptlab.plots.NotebookFigure (module __getattr__ below)
    NotebookFigure.__qualname__ = "NotebookFigure"
    return NotebookFigure


def notebook_figure(**kwargs: Any) -> Figure:
    """A matplotlib Figure (Figure's keyword arguments), never held by pyplot, that a notebook displays as a PNG
    when it is a cell's last value, whatever matplotlib backend the kernel has (or none)."""
    return _notebook_figure_class()(**kwargs)


def __getattr__(name: str) -> Any:
    if name == "NotebookFigure":      # made on first use: importing ptlab.plots does not import matplotlib
        return _notebook_figure_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def show_figure(fig: Figure) -> None:
    """Display a Figure as a PNG in the notebook, whatever matplotlib backend the kernel has (or none)."""
    import io

    from IPython.display import Image, display

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.dpi, bbox_inches="tight")
    display(Image(data=buffer.getvalue(), format="png"))


def image_grid(images, titles: list[str] | None = None, columns: int = 8, size: float = 1.1) -> Figure:
    """A grid of RGB images (B, 3, H, W) with values in [0, 1] (de-normalise first), each with an optional title.

    Values are clipped to [0, 1], which only removes float rounding from a de-normalised batch: check the range
    yourself before calling, since a wrong mean or std would be hidden by the clip.
    """
    if getattr(images, "ndim", None) != 4 or images.shape[1] != 3 or len(images) == 0:
        shape = tuple(getattr(images, "shape", ()))
        raise ValueError(f"images must be a non-empty (B, 3, H, W) batch, got shape {shape}")
    if titles is not None and len(titles) != len(images):
        raise ValueError(f"titles must give one title per image: {len(titles)} titles for {len(images)} images")
    if not isinstance(columns, int) or columns < 1:
        raise ValueError(f"columns must be a positive int, got {columns!r}")
    rows = -(-len(images) // columns)
    cols = min(columns, len(images))
    fig = notebook_figure(figsize=(size * cols, size * rows + 0.25 * rows * (titles is not None)))
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < len(images):
            ax.imshow(images[i].detach().cpu().clamp(0, 1).permute(1, 2, 0).numpy())   # (H, W, 3) for imshow
            if titles is not None:
                ax.set_title(titles[i], fontsize=7)
    fig.tight_layout()
    return fig
