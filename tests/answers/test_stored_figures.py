"""The figures a checker compares an answer with, recomputed from the right answers, which live only here.

A checker that holds its exercise's answer (the code, or a literal value) would ship it in the handout. So it
compares with stored figures instead: the outputs of the right answer (and of typical wrong ones, for the hints)
on the checker's fixed inputs, kept as data in `ptlab/lessons/chNN_<slug>/exercise_figures.py` (a Python literal,
so that a wheel carries it). Each answer test module says how each figure is made, in `FIGURES = {"exercise-id":
function returning that exercise's figures}`; this test recomputes every one, so a stored figure cannot go stale.
After changing an exercise's problem, rewrite them:

    python tests/answers/test_stored_figures.py
"""
from __future__ import annotations

import ast
import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from ptlab.course.exercises import all_exercises

HERE = Path(__file__).resolve().parent
MODULE = "exercise_figures"
HEADER = '''"""What chapter {chapter}'s checkers compare answers with: the right answers' outputs (and typical
wrong ones') on the checks' fixed inputs. Written by `python tests/answers/test_stored_figures.py`
from the answers in tests/answers, which the handout leaves out; not edited by hand."""
'''


def recipes() -> dict[str, Callable[[], Any]]:
    """Every answer test module's FIGURES, by exercise id."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    found: dict[str, Callable[[], Any]] = {}
    for path in sorted(HERE.glob("test_ch*_answers.py")):
        for exercise_id, recipe in getattr(importlib.import_module(path.stem), "FIGURES", {}).items():
            assert exercise_id not in found, f"{exercise_id}: two FIGURES recipes"
            found[exercise_id] = recipe
    return found


def figures_file(exercise_id: str) -> Path:
    """The exercise_figures.py beside the module that registers the exercise."""
    checker = next(e.checker for e in all_exercises() if e.id == exercise_id)
    return Path(sys.modules[checker.__module__].__file__).with_name(f"{MODULE}.py")


def stored_files() -> list[Path]:
    lessons = Path(sys.modules[all_exercises()[0].checker.__module__].__file__).parents[1]
    return sorted(lessons.glob(f"*/{MODULE}.py"))


def stored_in(path: Path) -> dict[str, Any]:
    """The FIGURES a lesson's exercise_figures.py holds (read as a literal: nothing in it runs)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["FIGURES"]]
    return ast.literal_eval(value)


def differences(stored: Any, computed: Any, where: str = "") -> list[str]:
    """Where two figures differ beyond float rounding (9 significant digits are stored)."""
    if isinstance(stored, dict) and isinstance(computed, dict):
        if stored.keys() != computed.keys():
            return [f"{where}: keys {sorted(stored)} stored, {sorted(computed)} computed"]
        return [d for key in stored for d in differences(stored[key], computed[key], f"{where}[{key!r}]")]
    if isinstance(stored, list) and isinstance(computed, (list, tuple)):
        if len(stored) != len(computed):
            return [f"{where}: {len(stored)} stored, {len(computed)} computed"]
        return [d for i, (s, c) in enumerate(zip(stored, computed)) for d in differences(s, c, f"{where}[{i}]")]
    if isinstance(stored, float) or isinstance(computed, float):
        same = isinstance(computed, (int, float)) and math.isclose(stored, computed, rel_tol=1e-6, abs_tol=1e-7)
    else:
        same = stored == computed
    return [] if same else [f"{where}: {stored!r} stored, {computed!r} computed"]


RECIPES = recipes()


def test_every_stored_figure_is_recomputed_here():
    stored = {key: path for path in stored_files() for key in stored_in(path)}
    assert sorted(stored) == sorted(RECIPES), "a stored figure without a recipe in FIGURES, or the reverse"
    for exercise_id, path in stored.items():
        assert path == figures_file(exercise_id), f"{exercise_id} is stored in {path}, not beside its checker"


@pytest.mark.parametrize("exercise_id", sorted(RECIPES))
def test_the_stored_figures_are_the_right_answers_outputs(exercise_id):
    path = figures_file(exercise_id)
    stored = stored_in(path).get(exercise_id) if path.exists() else None
    found = differences(stored, RECIPES[exercise_id]())
    assert found == [], (f"{exercise_id}: the figures in {path.parent.name}/{path.name} are stale; rewrite them "
                         "with `python tests/answers/test_stored_figures.py`:\n" + "\n".join(found[:10]))


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _rounded(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return float(f"{value:.9g}") if isinstance(value, float) else value


def dumps(value: Any, indent: str = "", column: int = 0) -> str:
    """A Python literal with a dict's keys one per line and a list of numbers wrapped at 120 characters (the value
    starts at `column` of its first line)."""
    inner = indent + "    "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(key)}: " for key in value]
        items = [item + dumps(v, inner, len(item)) for item, v in zip(items, value.values())]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}" if items else "{}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + dumps(v, inner, len(inner)) for v in value) + f"\n{indent}]"
    if isinstance(value, list) and column + len(json.dumps(value)) + 1 <= 120:
        return json.dumps(value)
    if isinstance(value, list):
        lines = [""]
        for text in map(json.dumps, value):
            if lines[-1] and len(inner) + len(lines[-1]) + len(text) + 3 > 120:
                lines.append("")
            lines[-1] += (", " if lines[-1] else "") + text
        return "[\n" + ",\n".join(inner + line for line in lines) + f"\n{indent}]"
    assert isinstance(value, (str, int, float)) and not isinstance(value, bool), f"cannot store {value!r}"
    return json.dumps(value)


def write_all() -> list[Path]:
    """Recompute every figure from the right answers and rewrite each lesson's exercise_figures.py."""
    by_file: dict[Path, dict[str, Any]] = {}
    for exercise_id in sorted(RECIPES):
        by_file.setdefault(figures_file(exercise_id), {})[exercise_id] = _rounded(RECIPES[exercise_id]())
    for path in set(stored_files()) - set(by_file):
        path.unlink()
    for path, figures in by_file.items():
        chapter = int(path.parent.name[2:4])
        path.write_text(HEADER.format(chapter=chapter) + "\nFIGURES = " + dumps(figures) + "\n", encoding="utf-8")
    return sorted(by_file)


if __name__ == "__main__":
    for written in write_all():
        print(f"wrote {written}")
