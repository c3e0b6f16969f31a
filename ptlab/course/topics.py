"""What the pitfall and exercise registries share: lesson modules found on disk, ids registered once."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

LESSONS = "ptlab.lessons"


def import_lesson_modules(prefix: str) -> None:
    """Import every lesson module whose name starts with `prefix` ("pitfalls", "exercises"): each registers its records."""
    lessons = importlib.import_module(LESSONS)
    for chapter in pkgutil.iter_modules(lessons.__path__):
        if not chapter.ispkg or chapter.name.startswith("_"):
            continue
        folder = importlib.import_module(f"{LESSONS}.{chapter.name}")
        for info in pkgutil.iter_modules(folder.__path__):
            if info.name.startswith(prefix):
                importlib.import_module(f"{folder.__name__}.{info.name}")


def refuse_second_id(registry: dict[str, Any], kind: str, record_id: str, fn: Callable,
                     fn_of: Callable[[Any], Callable]) -> None:
    """ValueError when another function already holds record_id (re-importing the same module is fine)."""
    if record_id in registry and fn_of(registry[record_id]).__qualname__ != fn.__qualname__:
        raise ValueError(f"{kind} id {record_id!r} is registered twice")
