"""`make handout`: the learners' zip holds no solutions and no answers, in one top-level folder."""
import ast
import json
import re
import subprocess
import zipfile

import pytest
from notebook_rules import ROOT


def test_the_handout_holds_no_solutions(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (a handout itself): `make handout` archives the committed HEAD")
    zip_path = tmp_path / "ptlab-handout.zip"
    subprocess.run(["make", "-s", "handout", f"HANDOUT_ZIP={zip_path}"], cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    names = zipfile.ZipFile(zip_path).namelist()
    assert {n.split("/", 1)[0] for n in names} == {"ptlab-handout"}, "one top-level folder"
    assert not any("notebooks/solutions" in n for n in names)
    assert not any("/tests/answers/" in n for n in names), "tests/answers holds every exercise's answer"
    assert "ptlab-handout/notebooks/01_tensors.ipynb" in names and "ptlab-handout/Makefile" in names
    with zipfile.ZipFile(zip_path) as handout:
        for name in names:
            if name.endswith(".ipynb") and "/notebooks/" in name:
                text = handout.read(name).decode("utf-8")
                if "solutions/" in text:
                    assert "handout leaves them out" in text, f"{name} points at solutions without saying where"

    with zipfile.ZipFile(zip_path) as handout:
        shipped = {name: handout.read(name).decode("utf-8") for name in names if name.endswith((".py", ".ipynb"))}
    answers = [f"{name}: {why}" for name, text in shipped.items() for why in answers_in(name, text)]
    assert answers == [], "the handout holds answers:\n" + "\n".join(answers)


EXERCISE_ID = re.compile(r"ch\d+-")


def answers_in(name: str, text: str) -> list[str]:
    """What in one file gives an exercise's answer away: code that passes an answer to check() and expects
    "correct" (a solution or an answer test), or a stored output in which an exercise was checked correct."""
    found, sources = [], [text]
    if name.endswith(".ipynb"):
        cells = json.loads(text)["cells"]
        sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        for cell in cells:
            for output in cell.get("outputs", []):
                shown = "".join(output.get("text", "")) + "".join(output.get("data", {}).get("text/plain", ""))
                found += [f"stored output: {line.strip()}" for line in shown.splitlines()
                          if re.match(r"\s*✔ ch\d+-[\w-]+: correct", line)]
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:          # a notebook cell with IPython syntax: nothing here can be an assert
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and _is_check_call(node.left) and any(
                    isinstance(c, ast.Constant) and c.value == "correct" for c in node.comparators):
                found.append(f"line {node.lineno}: compares a verdict with 'correct'")
            if (_is_check_call(node) and isinstance(node.args[0], ast.Constant)
                    and EXERCISE_ID.match(str(node.args[0].value)) and not name.endswith(".ipynb")):
                found.append(f"line {node.lineno}: checks an answer to {node.args[0].value}")
    return found


def _is_check_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "check"
            and bool(node.args))


def test_the_answer_finder_finds_each_kind_of_answer():
    assert answers_in("t.py", 'assert check("ch1-x", lambda v: v) == "correct"') == [
        "line 1: compares a verdict with 'correct'", "line 1: checks an answer to ch1-x"]
    cell = {"cell_type": "code", "source": ["check('ch2-y', f)"],
            "outputs": [{"output_type": "stream", "text": ["✔ ch2-y: correct.\n"]}]}
    assert answers_in("n.ipynb", json.dumps({"cells": [cell]})) == ["stored output: ✔ ch2-y: correct."]
    stub = {"cell_type": "code", "source": ["check('ch2-y', ...)"],
            "outputs": [{"output_type": "stream", "text": ["○ ch2-y: not attempted yet.\n"]}]}
    assert answers_in("n.ipynb", json.dumps({"cells": [stub]})) == []
    assert answers_in("t.py", 'pattern = r\'== "correct"\'') == []
    assert answers_in("t.py", 'ok = verdict.value == "correct"') == []
