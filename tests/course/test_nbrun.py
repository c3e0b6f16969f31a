"""Notebook running helpers: discovery, checked share, budgets."""
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from ptlab.course.nbrun import NotebookRun, budget_problems, checked_fraction, coalesce_streams, notebook_paths


def _printed(source, tags=()):
    cell = new_code_cell(source, outputs=[new_output("stream", name="stdout", text="1\n")])
    cell.metadata["tags"] = list(tags)
    return cell


def test_checked_fraction_counts_skip_and_ignore_from_tags_and_comments():
    nb = new_notebook(cells=[_printed("# NBVAL_IGNORE_OUTPUT\n1"), _printed("2", tags=["nbval-skip"]),
                             _printed("3"), _printed("4"), new_code_cell("   "), new_markdown_cell("x")])
    assert checked_fraction(nb) == 0.5


@pytest.mark.slow
def test_bench_runs_every_notebook_even_after_one_fails(tmp_path, capsys):
    from ptlab.course.bench import bench

    good = new_notebook(cells=[new_code_cell("print('fine')")])
    bad = new_notebook(cells=[new_code_cell("raise ValueError('a claim failed')"), new_code_cell("print(1)")])
    for name, nb in (("01_bad.ipynb", bad), ("02_good.ipynb", good)):
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / name)
    assert bench([tmp_path], markdown=True, speed=False) == 1
    out = capsys.readouterr().out
    assert "01_bad.ipynb" in out and "02_good.ipynb" in out
    assert "FAIL" in out and "failed at cell 0: ValueError: a claim failed" in out
    assert "| **all** |" in out
    assert "Mixed precision" not in out


def test_budget_problems_name_each_overrun():
    ok = NotebookRun(Path("a.ipynb"), 50.0, 5.0, 3, 900.0, 0.9)
    assert budget_problems(ok) == []
    bad = NotebookRun(Path("a.ipynb"), 130.0, 25.0, 7, 4000.0, 0.5)
    text = " ".join(budget_problems(bad))
    for part in ("130 s > 120 s", "cell 7 took 25 s", "4000 MiB", "50% of code cells"):
        assert part in text
    assert budget_problems(NotebookRun(Path("07_ddp.ipynb"), 140.0, 5.0, 3, 900.0, 0.9)) == []
    assert "160 s > 150 s" in " ".join(budget_problems(NotebookRun(Path("07_ddp.ipynb"), 160.0, 5.0, 3, 900.0, 0.9)))


def test_notebook_paths_finds_solutions_and_skips_checkpoints(tmp_path):
    for rel in ("01_a.ipynb", "solutions/01_a.ipynb", ".ipynb_checkpoints/01_a-checkpoint.ipynb"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(new_notebook(), tmp_path / rel)
    found = [p.relative_to(tmp_path).as_posix() for p in notebook_paths([tmp_path])]
    assert found == ["01_a.ipynb", "solutions/01_a.ipynb"]
    with pytest.raises(FileNotFoundError, match="not a notebook"):
        notebook_paths([tmp_path / "missing.ipynb"])


def test_consecutive_streams_of_one_name_are_merged_and_nothing_else():
    outputs = [new_output("stream", name="stdout", text="a\n"), new_output("stream", name="stdout", text="b\n"),
               new_output("stream", name="stderr", text="warn\n"), new_output("stream", name="stdout", text="c\n"),
               new_output("execute_result", data={"text/plain": "1"}, execution_count=1),
               new_output("stream", name="stdout", text="d\n")]
    merged = coalesce_streams(outputs)
    assert [(o.output_type, o.get("name"), o.get("text")) for o in merged] == [
        ("stream", "stdout", "a\nb\n"), ("stream", "stderr", "warn\n"), ("stream", "stdout", "c\n"),
        ("execute_result", None, None), ("stream", "stdout", "d\n")]


def _run(name: str, wall: float, slowest: float = 1.0, error: str | None = None) -> NotebookRun:
    return NotebookRun(Path(name), wall, slowest, 3, 500.0, 0.9, error)


def test_busy_table_prints_each_ratio_and_the_whole_courses():
    from ptlab.course.bench import busy_markdown, busy_over_quiet, busy_table

    pairs = [(_run("01_a.ipynb", 10.0), _run("01_a.ipynb", 12.0, 4.0)), (_run("02_b.ipynb", 30.0),
                                                                          _run("02_b.ipynb", 60.0, 9.5))]
    assert busy_over_quiet(pairs) == pytest.approx(72.0 / 40.0)
    rows = busy_table(pairs).splitlines()
    assert rows[2].split() == ["01_a.ipynb", "10.0", "12.0", "1.20x", "4.0", "(#3)"]
    assert rows[3].split()[3] == "2.00x" and rows[-1].split() == ["total", "40.0", "72.0", "1.80x"]
    assert busy_markdown(pairs).splitlines()[-1] == "| **all** | **40.0** | **72.0** | **1.80x** | |"


@pytest.mark.slow
def test_busy_bench_runs_each_notebook_quiet_then_beside_a_busy_process(tmp_path, capsys, monkeypatch):
    """A real run: the busy process must be alive while the busy run executes, and gone afterwards."""
    import psutil

    from ptlab.course import bench

    seen = []
    real_run = bench.run_notebook

    def run_and_count(path, *args, **kwargs):
        spinning = [p for p in psutil.Process().children() if "spinning" in " ".join(p.cmdline())]
        seen.append(len(spinning))
        return real_run(path, *args, **kwargs)

    monkeypatch.setattr(bench, "run_notebook", run_and_count)
    nb = new_notebook(cells=[new_code_cell("print('fine')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "01_fine.ipynb")
    bench.busy_bench([tmp_path], markdown=True)
    out = capsys.readouterr().out
    assert seen == [0, 1]
    assert "01_fine.ipynb" in out and "| **all** |" in out and "busy: one process spinning" in out
    assert not [p for p in psutil.Process().children() if "spinning" in " ".join(p.cmdline())]
