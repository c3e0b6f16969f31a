"""ptlab: runnable PyTorch pitfalls, widgets and checks for the course notebooks.

Importing ptlab changes no global state: no seeding, no warning filters, no backend flags.
"""
from __future__ import annotations

from .claims import Check, ClaimFailed, claim, claim_measured, exact, format_seconds, measured, measured_seconds
from .core import DeviceChoice, choose_device, get_device, seed_everything
from .course.exercises import check
from .course.pitfalls import all_pitfalls, compare_pitfall, get_pitfall, run_pitfall
from .timing import compare, time_callable

__version__ = "0.1.0"

__all__ = [
    "Check", "ClaimFailed", "claim", "claim_measured", "exact", "measured", "measured_seconds", "DeviceChoice",
    "choose_device", "get_device", "seed_everything", "check",
    "all_pitfalls", "compare_pitfall", "get_pitfall", "run_pitfall", "compare", "format_seconds",
    "time_callable", "show_pitfall", "versions",
]


def show_pitfall(pitfall_id: str):
    """The interactive widget for one pitfall (imports ipywidgets only when called)."""
    from .course.widgets import show_pitfall as _show

    return _show(pitfall_id)


def versions() -> dict[str, str]:
    """Python, torch, torchvision and ptlab versions, for a notebook's setup cell."""
    import platform

    import torch
    import torchvision

    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "ptlab": __version__}
