"""Committed notebooks: executed, clean, mostly output-checked, and wired to ptlab's records."""
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from notebook_rules import ROOT, gpu_branch_problem, problems

from ptlab.course.exercises import all_exercises
from ptlab.course.nbrun import KERNEL_ENV, checked_fraction, notebook_paths
from ptlab.course.pitfalls import all_pitfalls

NOTEBOOKS = notebook_paths([ROOT / "notebooks"])
CHAPTERS = [p for p in NOTEBOOKS if "solutions" not in p.parts]
IDS = [str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS]
CHECKED_FRACTIONS: dict[str, float] = {}


def chapter_of(path: Path) -> int:
    match = re.match(r"(\d\d)_", path.name)
    assert match, f"{path.name}: chapter notebooks are named NN_slug.ipynb"
    return int(match.group(1))


def test_there_are_chapters():
    assert CHAPTERS and all(chapter_of(p) for p in CHAPTERS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_is_clean(path):
    found = problems(nbformat.read(path, as_version=4))
    assert not found, f"{path.name}:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_most_cells_are_output_checked(path):
    fraction = checked_fraction(nbformat.read(path, as_version=4))
    CHECKED_FRACTIONS[str(path.relative_to(ROOT))] = fraction
    assert fraction >= 0.80, (f"{path.name}: only {fraction:.0%} of code cells have output strict nbval really "
                              "compares (need 80%; a widget view or a figure alone does not count)")


def chapter_notebooks() -> dict[int, list[Path]]:
    """Each chapter's notebooks: one, or parts named NN_<slug> that share the chapter number (chapter 4 has two)."""
    chapters: dict[int, list[Path]] = {}
    for path in CHAPTERS:
        chapters.setdefault(chapter_of(path), []).append(path)
    return chapters


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_every_pitfall_widget_is_displayed(path):
    """show_pitfall returns the widget: Jupyter shows it only as a cell's last expression (no `;`), or through
    display(). Every call must be one of the two forms, `show_pitfall("id")` last, or `display(show_pitfall("id"))`."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        lines = [line.strip() for line in cell.source.strip().splitlines() if line.strip()]
        for i, line in enumerate(lines):
            if "show_pitfall(" not in line or line.startswith(("from ", "import ")):
                continue
            shown_last = re.fullmatch(r'show_pitfall\("[a-z0-9-]+"\)', line) and i == len(lines) - 1
            displayed = re.fullmatch(r'display\(show_pitfall\("[a-z0-9-]+"\)\)', line)
            assert shown_last or displayed, (f"{path.name}: {line!r} does not show the widget: make it the cell's last "
                                             "line without ';', or wrap it in display(...)")


def _code(path: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


@pytest.mark.parametrize("chapter", sorted(chapter_notebooks()), ids=lambda n: f"ch{n}")
def test_every_pitfall_of_the_chapter_has_its_widget_and_check(chapter):
    paths = chapter_notebooks()[chapter]
    source = "\n".join(_code(p) for p in paths)
    names = " or ".join(p.name for p in paths)
    for record in all_pitfalls(chapter=chapter):
        assert f'show_pitfall("{record.id}")' in source, f"{names} has no widget for {record.id}"
        assert f'compare_pitfall("{record.id}"' in source, f"{names} never runs {record.id} both ways"


@pytest.mark.parametrize("chapter", sorted(chapter_notebooks()), ids=lambda n: f"ch{n}")
def test_every_exercise_is_posed_and_solved(chapter):
    paths = chapter_notebooks()[chapter]
    exercises = all_exercises(chapter=chapter)
    assert len(exercises) >= 2, f"chapter {chapter} needs at least 2 exercises"
    posing = {p: _code(p) for p in paths}
    for ex in exercises:
        assert any(f'check("{ex.id}"' in code for code in posing.values()), \
            f"{' or '.join(p.name for p in paths)} does not pose {ex.id}"
    solutions = paths[0].parent / "solutions"
    if not solutions.exists():
        pytest.skip("no notebooks/solutions/ (a workshop handout): the solutions are checked in the full course")
    for path, code in posing.items():
        posed_here = [ex for ex in exercises if f'check("{ex.id}"' in code]
        if not posed_here:
            continue
        solution_path = solutions / path.name
        assert solution_path.exists(), f"{solution_path.name} is missing from notebooks/solutions/"
        solved = _code(solution_path)
        for ex in posed_here:
            pattern = rf'assert check\("{re.escape(ex.id)}",[^\n]*\)\s*==\s*"correct"'
            assert re.search(pattern, solved), (f"{solution_path.name} does not solve {ex.id} "
                                                f"(assert check(...) == \"correct\")")


def _run_nbval(tmp_path, cells, extra_files=None):
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [new_code_cell(src, execution_count=i + 1, outputs=[new_output("stream", name="stdout", text=out)])
                for i, (src, out) in enumerate(cells)]
    nbformat.write(nb, tmp_path / "probe.ipynb")
    for name, text in (extra_files or {}).items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    env = {**__import__("os").environ, **KERNEL_ENV}
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-q",
                           "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path / "probe.ipynb")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_strict_nbval_fails_on_a_deprecation_warning(tmp_path):
    """The harness itself: a torch FutureWarning, or a DeprecationWarning raised in library code, fails."""
    result = _run_nbval(tmp_path, [
        ("print('fine')", "fine\n"),
        ("import torch\nwith torch.cuda.amp.autocast(enabled=False):\n    print('ok')", "ok\n"),
        ("import oldlib\nprint(oldlib.old_api())", "1\n"),
    ], extra_files={"oldlib.py": """
        import warnings
        def old_api():
            warnings.warn("old_api is deprecated", DeprecationWarning, stacklevel=1)
            return 1
    """})
    assert "1 passed" in result.stdout and "2 failed" in result.stdout, result.stdout[-3000:]


def test_the_rules_catch_each_defect():
    from nbformat.v4 import new_code_cell, new_notebook, new_output
    from notebook_rules import ROOT as root

    nb = new_notebook()
    nb.cells = [
        new_code_cell("x = 1"),                                               # never executed
        new_code_cell("1/0", execution_count=2, outputs=[new_output(
            "error", ename="ZeroDivisionError", evalue="division by zero", traceback=[])]),
        new_code_cell("print(p)", execution_count=3, outputs=[new_output(
            "stream", name="stdout", text=f"{root}/data/file.npz\n")]),
        new_code_cell("import torch", execution_count=4, outputs=[new_output(
            "stream", name="stderr", text="FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated\n")]),
        new_code_cell("def claim(s, ok):\n    pass", execution_count=5, outputs=[]),
        new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(1)", execution_count=6,
                      outputs=[new_output("stream", name="stdout", text="1\n")]),
        new_code_cell("if torch.cuda.is_available():\n    claim('x', True)\nelse:\n    print('skipped')",
                      execution_count=7, outputs=[new_output("stream", name="stdout", text="skipped\n")]),
        new_code_cell("if device.type == 'cuda':\n    print(1)", execution_count=8, metadata={"tags": [
            "nbval-ignore-output"]}, outputs=[new_output("stream", name="stdout", text="1\n")]),
        new_code_cell("history.plot()", execution_count=9, outputs=[new_output(
            "execute_result", data={"text/plain": "<Figure size 900x340 with 2 Axes>"}, execution_count=9)]),
        new_code_cell("fig", execution_count=10, outputs=[new_output(       # drawn: the text beside the PNG is fine
            "execute_result", data={"text/plain": "<Figure size 900x340 with 2 Axes>", "image/png": "iVBO"},
            execution_count=10)]),
    ]
    ignored = {"tags": ["nbval-ignore-output"]}
    gpu_cells = [  # (source, tagged, expected problem or None)
        ("if not torch.cuda.is_available():\n    print('skipped')\nelse:\n    claim('x', True)", True, None),
        ("if not torch.cuda.is_available():\n    claim('x', True)\nelse:\n    print(1)", True, "asserts no claim"),
        ("if device.type != 'cuda':\n    print('skipped')\nelse:\n    print(1)", True, "asserts no claim"),
        ("if 'cuda' == device.type:\n    print(1)", False, "not tagged"),
        ("if torch.cuda.device_count() > 0:\n    print(1)", False, "not tagged"),
        ("has_gpu = torch.cuda.is_available()\nif has_gpu:\n    print(1)", False, "not tagged"),
        ("if device.type in ('cuda', 'mps'):\n    print(1)", False, "not tagged"),
        ("print(torch.cuda.is_available())", False, None),
    ]
    for source, tagged, expected in gpu_cells:
        problem = gpu_branch_problem(new_code_cell(source, metadata=ignored if tagged else {}))
        assert (problem is None) if expected is None else (expected in (problem or "")), (source, problem)
    found = "\n".join(problems(nb))
    for expected in ("no stored execution", "stores an error: ZeroDivisionError", "path of this machine",
                     "FutureWarning", "has no stored output", "defines ['claim']", "use the cell tag",
                     "branches on a CUDA GPU but is not tagged nbval-ignore-output",
                     "branches on a CUDA GPU but asserts no claim there",
                     "code cell 8 ('history.plot()') stores the figure as the text '<Figure size 900x340 with 2 Axes>' "
                     "and no image"):
        assert expected in found, f"{expected!r} not reported in:\n{found}"
    assert "code cell 9 ('fig')" not in found, "a figure drawn as a PNG is not a defect"


def test_checked_share_counts_only_outputs_nbval_compares():
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from ptlab.course.nbrun import checked_fraction

    widget = new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "x"},
                                              "text/plain": "PitfallWidget('x')"})
    figure = new_output("display_data", data={"image/png": "", "text/plain": "<Figure size 550x300 with 1 Axes>"})
    image = new_output("display_data", data={"image/png": "", "text/plain": "<IPython.core.display.Image object>"})
    printed = new_output("stream", name="stdout", text="✔ fine\n")
    ignored = new_code_cell("print(1)", execution_count=4, outputs=[printed])
    ignored.metadata["tags"] = ["nbval-ignore-output"]
    nb = new_notebook()
    nb.cells = [new_code_cell("show()", execution_count=1, outputs=[widget, image]),
                new_code_cell("plot()", execution_count=2, outputs=[figure]),
                new_code_cell("print(1)", execution_count=3, outputs=[printed, figure]),
                ignored]
    assert checked_fraction(nb) == 0.25
