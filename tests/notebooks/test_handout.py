"""`make handout`: the learners' zip holds no solutions and no answers, in one top-level folder."""
import ast
import importlib
import importlib.util
import inspect
import json
import re
import subprocess
import zipfile
from pathlib import Path

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


ANSWER_TESTS = ROOT / "tests" / "answers"
SHIPPED_CODE = ROOT / "ptlab"                 # `make handout` leaves out only notebooks/solutions and tests/answers
# A take-away tool that its chapter teaches before the exercise asks for one like it: shipping it is the course's
# choice, made in the open, not a checker holding its answer. Each entry names the exercise and why.
TAUGHT_TOOLS = {
    "ptlab.workers.seed_worker_numpy_rng": "ch3-worker-seeding: chapter 3's pitfall shows this tool as its fix "
                                           "(README tools table); the exercise asks for a worker_init_fn like it",
}


def test_no_shipped_function_is_a_correct_answer():
    """A function that an answer test passes as a correct answer must not ship: if it is defined under ptlab/, a
    learner can import it (or read it) instead of solving the exercise."""
    found = [f"{path.relative_to(ROOT)}: {why}" for path in sorted(ANSWER_TESTS.glob("test_*.py"))
             for why in shipped_answers_in(path)]
    assert found == [], "the handout ships a correct answer:\n" + "\n".join(found)
    for qualified in TAUGHT_TOOLS:
        module, name = qualified.rsplit(".", 1)
        assert inspect.isfunction(getattr(importlib.import_module(module), name, None)), f"{qualified} is gone"


def shipped_answers_in(path) -> list[str]:
    """The functions defined under ptlab/ that one answer test passes as a correct answer, or that a function it
    passes (one written in the test, a lambda or a def) calls."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    spec = importlib.util.spec_from_file_location(f"_handout_probe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    defined = {node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = []
    for line, answer in correct_answers(tree):
        for name in sorted(_names_reached(answer, defined)):
            obj = _resolve(name, vars(module))
            source = _source_file(obj)
            taught = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}" in TAUGHT_TOOLS
            if source is not None and SHIPPED_CODE in source.parents and not taught:
                found.append(f"line {line}: {name}, defined in {source.relative_to(ROOT)}, is (or makes) a correct "
                             "answer, and ptlab/ ships in the handout")
    return found


def correct_answers(tree: ast.AST) -> list[tuple[int, ast.expr]]:
    """Each answer passed as correct: `check("id", answer) == "correct"`, or a checker `check_...(answer)` called
    on its own (it returns on a correct answer), unless inside `with pytest.raises(...)`."""
    found, refused = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any("raises" in ast.unparse(item.context_expr) for item in node.items):
            refused |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Compare) and _is_check_call(node.left) and len(node.left.args) == 2
                and any(isinstance(c, ast.Constant) and c.value == "correct" for c in node.comparators)):
            found.append((node.lineno, node.left.args[1]))
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and node.value.args
              and getattr(node.value.func, "id", "").startswith("check_") and id(node) not in refused):
            found.append((node.lineno, node.value.args[0]))
    return sorted(found, key=lambda pair: pair[0])


def _names_reached(expr: ast.AST, defined: dict[str, ast.AST]) -> set[str]:
    """The names (`f`, `module.f`) an answer expression uses, and those used by the test's own functions it names."""
    names, todo, seen = set(), [expr], set()
    while todo:
        node = todo.pop()
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Name, ast.Attribute)) and isinstance(sub.ctx, ast.Load):
                name = ast.unparse(sub)
                names.add(name)
                if name in defined and name not in seen:
                    seen.add(name)
                    todo.append(defined[name])
    return names


def _resolve(name: str, namespace: dict):
    head, *rest = name.split(".")
    if head not in namespace:
        return None
    obj = namespace[head]
    for attr in rest:
        obj = getattr(obj, attr, None)
    return obj


def _source_file(obj):
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj)):
        return None
    try:
        return Path(inspect.getsourcefile(obj)).resolve()
    except (TypeError, OSError):
        return None


def test_the_shipped_answer_finder_finds_a_shipped_function_passed_as_correct(tmp_path):
    test = tmp_path / "test_probe_answers.py"
    test.write_text("import pytest\n"
                    "from ptlab.course.exercises import Wrong, calls_stub, check\n"
                    "from ptlab.lessons.ch01_tensors.exercises import check_safe_contrast\n"
                    "from ptlab.lessons.ch02_autograd.exercises import hard_gate\n\n"
                    "def right(*args):\n"
                    "    return calls_stub(*args)\n\n"
                    "def test_it():\n"
                    "    assert check('ch2-why-no-training', ('gate', hard_gate)) == 'correct'\n"
                    "    assert check('ch1-safe-contrast', lambda img, f: right(img, f)) == 'correct'\n"
                    "    assert check('ch1-safe-contrast', hard_gate) == 'wrong'\n"
                    "    check_safe_contrast(check)\n"
                    "    with pytest.raises(Wrong):\n"
                    "        check_safe_contrast(hard_gate)\n", encoding="utf-8")
    found = shipped_answers_in(test)
    assert [f.split(",")[0] for f in found] == ["line 10: hard_gate", "line 11: calls_stub", "line 13: check"], found
