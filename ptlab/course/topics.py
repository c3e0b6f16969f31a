"""What the pitfall and exercise registries share: lesson folders found on disk, ids registered once."""
from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any, Callable

LESSONS = "ptlab.lessons"
# chNN_<slug>: the chapter's number and its notebook's name, notebooks/NN_<slug>.ipynb
LESSON_FOLDER = re.compile(r"ch(\d\d)_([a-z][a-z0-9]*(?:_[a-z0-9]+)*)")


class LessonLayoutError(RuntimeError):
    """A folder under ptlab/lessons/ that is not a whole chapter (its message says what is missing)."""


def lesson_folders(root: Path | None = None) -> dict[int, Path]:
    """{chapter: folder} of every chapter under ptlab/lessons/; LessonLayoutError names each folder missing a part."""
    root = Path(next(iter(importlib.import_module(LESSONS).__path__))) if root is None else root
    folders: dict[int, Path] = {}
    problems = []
    for path in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        if not any(path.glob("*.py")):
            continue   # no Python file at all (a folder left with only __pycache__ by a branch switch): no chapter
        where = f"ptlab/lessons/{path.name}"
        match = LESSON_FOLDER.fullmatch(path.name)
        if match is None:
            problems.append(f"{where}: name a lesson folder chNN_<slug>, after its notebook notebooks/NN_<slug>.ipynb")
            continue
        chapter = int(match.group(1))
        if chapter in folders:
            problems.append(f"{where}: chapter {chapter} already has ptlab/lessons/{folders[chapter].name}")
        if not (path / "__init__.py").is_file():
            problems.append(f"{where} has no __init__.py: add one with the chapter's one-line docstring")
        if not any(path.glob("pitfalls*.py")):
            problems.append(f"{where} has no pitfalls.py (or pitfalls_<topic>.py)")
        if not (path / "exercises.py").is_file():
            problems.append(f"{where} has no exercises.py")
        folders.setdefault(chapter, path)
    if problems:
        raise LessonLayoutError("ptlab/lessons/ holds a folder that is not a whole chapter:\n- "
                                + "\n- ".join(problems))
    return dict(sorted(folders.items()))


def import_lesson_modules(prefix: str) -> None:
    """Import every lesson module named `prefix`* ("pitfalls", "exercises"): each registers its records."""
    for folder in lesson_folders().values():
        for info in pkgutil.iter_modules([str(folder)]):
            if info.name.startswith(prefix):
                importlib.import_module(f"{LESSONS}.{folder.name}.{info.name}")


def refuse_second_id(registry: dict[str, Any], kind: str, record_id: str, fn: Callable,
                     fn_of: Callable[[Any], Callable]) -> None:
    """ValueError when another function already holds record_id (re-importing the same module is fine)."""
    if record_id in registry and fn_of(registry[record_id]).__qualname__ != fn.__qualname__:
        raise ValueError(f"{kind} id {record_id!r} is registered twice")
