"""Old import paths kept working, silently, after the layout change (a warning would fail strict nbval).

A module whose names moved out keeps them reachable through `__getattr__ = moved(__name__, {...})`; a whole module
that moved leaves a shim at its old path. tests/course/test_layering.py resolves every entry, so none goes stale.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

# old module -> {name: the module it lives in now}
MOVED_NAMES: dict[str, dict[str, str]] = {}


def moved(module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module-level __getattr__ that finds each moved name in its new module when it is first asked for."""
    MOVED_NAMES[module] = names

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def alias_submodules(package: str, submodules: dict[str, str]) -> None:
    """Make `package.old` import the module now at `new` (the same module object, not a copy)."""
    for old, new in submodules.items():
        sys.modules.setdefault(f"{package}.{old}", importlib.import_module(new))
