"""The browser tests' own judgement, checked without a browser: what counts as a blank plot."""
import io
import sys
from pathlib import Path

from matplotlib.figure import Figure
from PIL import Image

sys.path.insert(0, str(Path(__file__).parents[1] / "browser"))
from labdriver import png_is_blank  # noqa: E402


def _png(fig_or_image) -> bytes:
    buffer = io.BytesIO()
    if isinstance(fig_or_image, Figure):
        fig_or_image.savefig(buffer, format="png")
    else:
        fig_or_image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_white_image_is_blank_and_a_plot_is_not():
    assert png_is_blank(_png(Image.new("RGB", (80, 60), "white")))
    fig = Figure(figsize=(2, 1.5))
    fig.subplots().plot([1, 2, 3], [3, 1, 2])
    assert not png_is_blank(_png(fig))
