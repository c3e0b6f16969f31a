"""What the pitfall and exercise registries share: topic modules found on disk, ids registered once."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Iterable


def import_topic_modules(package: str, path: Iterable[str], skip: Iterable[str] = ()) -> None:
    """Import every module of a package (each registers its records on import), except `skip` and _private ones."""
    skipped = set(skip)
    for info in pkgutil.iter_modules(path):
        if info.name not in skipped and not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def refuse_second_id(registry: dict[str, Any], kind: str, record_id: str, fn: Callable,
                     fn_of: Callable[[Any], Callable]) -> None:
    """ValueError when another function already holds record_id (re-importing the same module is fine)."""
    if record_id in registry and fn_of(registry[record_id]).__qualname__ != fn.__qualname__:
        raise ValueError(f"{kind} id {record_id!r} is registered twice")
