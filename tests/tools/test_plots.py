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
