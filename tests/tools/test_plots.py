"""ptlab.plots: the figures the widgets and notebooks draw."""
from __future__ import annotations

import pytest
import torch

from ptlab.plots import image_grid


def test_image_grid_lays_out_rows_and_titles() -> None:
    images = torch.rand(10, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    fig = image_grid(images, [f"image {i}" for i in range(10)], columns=4)
    axes = fig.get_axes()
    assert len(axes) == 12                                                   # 3 rows of 4, two left empty
    assert [ax.get_title() for ax in axes[:10]] == [f"image {i}" for i in range(10)]
    assert len(axes[0].get_images()) == 1 and not axes[11].get_images()
    assert axes[0].get_images()[0].get_array().shape == (8, 8, 3)             # drawn as (H, W, 3)


def test_image_grid_clips_only_for_display() -> None:
    images = torch.full((1, 3, 2, 2), 1.5)
    drawn = image_grid(images).get_axes()[0].get_images()[0].get_array()
    assert float(drawn.max()) == 1.0 and float(images.max()) == 1.5           # the caller's tensor is untouched


def test_image_grid_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        image_grid(torch.zeros(3, 8, 8))
    with pytest.raises(ValueError, match="one title per image"):
        image_grid(torch.zeros(2, 3, 8, 8), ["only one"])
    with pytest.raises(ValueError, match="columns"):
        image_grid(torch.zeros(2, 3, 8, 8), columns=0)


def _figures():
    """Figures ptlab hands a learner: a fit history, a pitfall's series, an image grid, an lr range test."""
    from types import SimpleNamespace

    from ptlab.clinic import LRRangeResult
    from ptlab.plots import plot_series
    from ptlab.train import History

    history = History(epoch=[1, 2, 3], train_loss=[1.0, 0.6, 0.5], train_acc=[0.5, 0.7, 0.8], val_loss=[0.9, 0.7, 0.6],
                      val_acc=[0.6, 0.7, 0.75])
    outcome = SimpleNamespace(series={"loss": [3.0, 2.0, 1.0]}, x_label="step")
    lr_test = LRRangeResult(lrs=[0.01, 0.1, 1.0], losses=[2.0, 1.0, 5.0], smoothed=[2.0, 1.2, 3.0])
    return {"History.plot": history.plot(title="t"), "plot_series": plot_series({"bug on": outcome}),
            "image_grid": image_grid(torch.rand(2, 3, 4, 4)), "LRRangeResult.plot": lr_test.plot()}


def test_a_figure_that_ends_a_cell_is_displayed_as_a_png(monkeypatch) -> None:
    """IPython hands a cell's last value to its _ipython_display_: a ptlab figure shows itself through show_figure,
    a PNG, instead of the text '<Figure size 900x340 with 2 Axes>' (chapter 4's learning curves were only that)."""
    import IPython.display
    from IPython.core.formatters import DisplayFormatter

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **_: shown.extend(objs))
    for name, fig in _figures().items():
        shown.clear()
        assert DisplayFormatter().format(fig) == ({}, {}), f"{name}: shown as text, not drawn"
        assert len(shown) == 1 and isinstance(shown[0], IPython.display.Image), name
        assert shown[0].format == "png" and shown[0].data[:8] == b"\x89PNG\r\n\x1a\n", name


def test_history_plot_has_whole_epochs_and_pickles() -> None:
    import pickle

    fig = _figures()["History.plot"]
    fig.canvas.draw()
    ticks = [t for ax in fig.axes for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert type(pickle.loads(pickle.dumps(fig))).__name__ == "NotebookFigure"


@pytest.mark.slow
def test_history_plot_at_the_end_of_a_cell_stores_a_png_in_a_real_kernel(tmp_path) -> None:
    """What chapter 4 does, in a fresh kernel, with pyplot imported and without: the stored output is the image."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from ptlab.course.nbrun import run_notebook

    make = "from ptlab.train import History\nh = History(epoch=[1, 2], train_loss=[1.0, 0.5], val_loss=[1.0, 0.6], " \
           "train_acc=[0.5, 0.6], val_acc=[0.5, 0.7])\n"
    nb = new_notebook(cells=[new_code_cell(make + 'h.plot(title="t")'),
                             new_code_cell('import matplotlib.pyplot as plt\nh.plot(title="t")')])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "plot.ipynb")
    assert run_notebook(tmp_path / "plot.ipynb", write=True).error is None
    for cell in nbformat.read(tmp_path / "plot.ipynb", as_version=4).cells:
        (output,) = cell.outputs
        assert output.output_type == "display_data" and output.data["image/png"], cell.outputs
        assert output.data["text/plain"] == "<IPython.core.display.Image object>"
