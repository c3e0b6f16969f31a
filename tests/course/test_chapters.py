"""Chapters are found on disk, loudly: lesson folders, their notebooks, and the README's chapter table agree."""
from __future__ import annotations

import re

import pytest
from notebook_rules import ROOT

from ptlab.course import topics
from ptlab.course.exercises import all_exercises
from ptlab.course.pitfalls import all_pitfalls
from ptlab.course.topics import LessonLayoutError, lesson_folders

CHAPTER_NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ROW = re.compile(r"\| (?P<number>\d+)[^|]*\| \[(?P<text>[^\]]*)\]\(notebooks/(?P<target>[^)]*)\) \|")


def _write(root, *paths: str) -> None:
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text('"""A file of a planted lesson folder."""\n')


def test_a_lesson_folder_missing_a_part_fails_with_what_is_missing(tmp_path, monkeypatch):
    _write(tmp_path, "ch01_ok/__init__.py", "ch01_ok/pitfalls.py", "ch01_ok/exercises.py", "_private/__init__.py",
           "ch09_left_behind/__pycache__/pitfalls.cpython-311.pyc")   # no .py file: not a chapter, not an error
    assert lesson_folders(tmp_path) == {1: tmp_path / "ch01_ok"}
    _write(tmp_path, "ch02_no_init/pitfalls.py", "ch02_no_init/exercises.py",
           "ch03_parts/__init__.py", "ch03_parts/pitfalls_topic.py",
           "ch04_no_pitfalls/__init__.py", "ch04_no_pitfalls/exercises.py",
           "ch01_second/__init__.py", "ch01_second/pitfalls.py", "ch01_second/exercises.py",
           "chapter5/__init__.py", "chapter5/pitfalls.py", "chapter5/exercises.py")
    with pytest.raises(LessonLayoutError) as raised:
        lesson_folders(tmp_path)
    assert str(raised.value).splitlines() == [
        "ptlab/lessons/ holds a folder that is not a whole chapter:",
        "- ptlab/lessons/ch01_second: chapter 1 already has ptlab/lessons/ch01_ok",
        "- ptlab/lessons/ch02_no_init has no __init__.py: add one with the chapter's one-line docstring",
        "- ptlab/lessons/ch03_parts has no exercises.py",
        "- ptlab/lessons/ch04_no_pitfalls has no pitfalls.py (or pitfalls_<topic>.py)",
        "- ptlab/lessons/chapter5: name a lesson folder chNN_<slug>, after its notebook notebooks/NN_<slug>.ipynb",
    ]
    # every lookup discovers the lessons again, so the registries raise it too, instead of missing a chapter
    monkeypatch.setattr(topics, "lesson_folders", lambda: lesson_folders(tmp_path))
    for lookup in (all_pitfalls, all_exercises):
        with pytest.raises(LessonLayoutError, match="ch02_no_init has no __init__.py"):
            lookup()


def test_chapters_are_numbered_from_1_without_a_gap_each_with_its_notebook_and_records():
    folders = lesson_folders()
    assert list(folders) == list(range(1, len(folders) + 1)), f"lesson folders: {[p.name for p in folders.values()]}"
    for chapter, folder in folders.items():
        notebook = f"{folder.name[2:]}.ipynb"    # ch04_cnn_training -> 04_cnn_training.ipynb
        assert notebook in CHAPTER_NOTEBOOKS, f"ptlab/lessons/{folder.name} has no notebook notebooks/{notebook}"
    orphans = [n for n in CHAPTER_NOTEBOOKS if int(n[:2]) not in folders]
    assert not orphans, f"notebooks whose chapter has no folder ptlab/lessons/chNN_<slug>/: {orphans}"
    pitfalls, exercises = all_pitfalls(), all_exercises()
    for record in pitfalls:
        assert record.reproduce.__module__.startswith(f"ptlab.lessons.{folders[record.chapter].name}."), \
            f"pitfall {record.id} (chapter {record.chapter}) lives in {record.reproduce.__module__}"
    for ex in exercises:
        assert ex.checker.__module__ == f"ptlab.lessons.{folders[ex.chapter].name}.exercises", \
            f"exercise {ex.id} (chapter {ex.chapter}) lives in {ex.checker.__module__}"
    empty = [c for c in folders if not any(p.chapter == c for p in pitfalls)]
    assert not empty, f"chapters whose lesson folder registers no pitfall: {empty}"


def chapter_table_problems(readme: str, notebooks: list[str]) -> list[str]:
    """What the README's chapter table gets wrong: a notebook without a row, a row out of order or to nowhere."""
    lines = readme.split("\n## Chapters\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| # |"))   # the section's first table
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[start + 2:end]                                                  # after its header and |---|
    problems, linked = [], []
    for row in rows:
        found = ROW.match(row)
        if found is None:
            problems.append(f"a row that links no notebook: {row[:60]}")
        elif found["target"] not in notebooks:
            problems.append(f"the row of chapter {found['number']} links notebooks/{found['target']}, which is not "
                            "a chapter notebook")
        elif int(found["number"]) != int(found["target"][:2]) or found["text"] != found["target"][:-len(".ipynb")]:
            problems.append(f"the row of notebooks/{found['target']} says chapter {found['number']} and shows "
                            f"[{found['text']}]")
        else:
            linked.append(found["target"])
    problems += [f"notebooks/{n} has no row" for n in notebooks if n not in linked]
    if linked != sorted(linked):
        problems.append(f"rows out of chapter order: {linked}")
    return problems


def test_the_readme_chapter_table_has_a_row_per_chapter_notebook_in_order():
    assert chapter_table_problems((ROOT / "README.md").read_text(encoding="utf-8"), CHAPTER_NOTEBOOKS) == []


def test_the_chapter_table_check_fails_on_a_missing_a_stray_and_a_swapped_row():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {n: next(line for line in readme.splitlines() if f"](notebooks/{n})" in line) for n in CHAPTER_NOTEBOOKS}
    first, second = rows[CHAPTER_NOTEBOOKS[0]], rows[CHAPTER_NOTEBOOKS[1]]
    doctored = (readme.replace(first, "\0").replace(second, first).replace("\0", second)
                .replace(rows[CHAPTER_NOTEBOOKS[-1]], "| 9 | [09_gone](notebooks/09_gone.ipynb) | x |"))
    assert chapter_table_problems(doctored, CHAPTER_NOTEBOOKS) == [
        "the row of chapter 9 links notebooks/09_gone.ipynb, which is not a chapter notebook",
        f"notebooks/{CHAPTER_NOTEBOOKS[-1]} has no row",
        f"rows out of chapter order: {[CHAPTER_NOTEBOOKS[1], CHAPTER_NOTEBOOKS[0], *CHAPTER_NOTEBOOKS[2:-1]]}",
    ]
