"""`python -m ptlab gpu-check`, rehearsed on the CPU (--allow-cpu): the same machinery a GPU machine runs."""
import importlib.util
import re
import subprocess
import sys

import nbformat
import pytest
import torch
from notebook_rules import ROOT

from ptlab.__main__ import main
from ptlab.course import gpu_check, gpu_env

FAST_TEST = "tests/course/test_layering.py::test_the_package_keeps_its_layers"


def test_refuses_without_a_gpu_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["gpu-check", "--out", str(tmp_path), "--no-tests"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no CUDA GPU" in err and "--allow-cpu" in err
    assert not any(tmp_path.iterdir())


def test_cpu_rehearsal_on_the_shortest_solution_notebook(tmp_path):
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "ptlab", "gpu-check", "--allow-cpu", "--out", str(out),
                           "--notebooks", "notebooks/solutions/01_tensors.ipynb", "--tests", FAST_TEST],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    report = (out / "report.md").read_text()
    assert done.returncode == 0, done.stdout + done.stderr
    assert report in done.stdout
    assert f"- device: {gpu_env.REHEARSAL}" in report and "torch " in report and "cuDNN" in report
    assert "UTC; commit: " in report and "CPUs" in report and "OMP_NUM_THREADS=" in report
    assert "| notebook | s | errors |" in report and "## Notebooks: 1, 0 cell errors, 0 not finished" in report
    assert "| sol01 01_tensors |" in report and "missing:" not in report
    assert "1 passed in" in report and report.rstrip().splitlines()[-1].startswith("RESULT: PASS")
    assert {"report.md", "tests.txt", "tracebacks.txt", "gpu-cells.txt"} <= {p.name for p in out.iterdir()}


def _notebook(path, *sources, tags=None):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a notebook the check runs")]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    for index, tag in (tags or {}).items():
        nb.cells[index].metadata["tags"] = [tag]
    nbformat.write(nb, path)
    return path


def test_failed_claims_timeouts_and_the_deadline_are_reported(tmp_path, capsys):
    record_line = "import json, os; open(os.environ['PTLAB_GPU_RECORD'], 'a').write(json.dumps({'x': 1}) + '\\n')"
    bad = _notebook(tmp_path / "bad_claim.ipynb",
                    "x = 1",
                    "assert x == 2, 'the claim:\\nx is 2'",                      # a failed claim: c2
                    "import torch\nprint('GPU' if torch.cuda.is_available() else 'skipped: no CUDA GPU here')",
                    "raise ValueError('expected, tagged')",                      # c4, tagged: not an error
                    "print(1 / 0)",                                              # c5: runs on after an error
                    record_line, tags={4: "raises-exception"})
    slow = _notebook(tmp_path / "slow_cell.ipynb", "import time", "time.sleep(60)", "print('never')")
    long = _notebook(tmp_path / "long_run.ipynb", *["import time; time.sleep(0.5)"] * 160)
    # The deadline leaves bad_claim time to finish on a busy laptop (three kernels start at once; at 16 s it did
    # not finish beside other work on 2 cores), and long_run's 80 s stays far beyond it.
    code = gpu_check.gpu_check([bad, slow, long], tmp_path / "out", lanes=3, cell_timeout_s=4, deadline_s=30,
                               tests_s=0, test_ids=[], allow_cpu=True, log=lambda line: None)
    report = capsys.readouterr().out
    assert code == 1 and report.strip() == (tmp_path / "out" / "report.md").read_text().strip()
    assert "bad_claim:c2 AssertionError: x is 2" in report
    assert "bad_claim:c5 ZeroDivisionError: division by zero" in report
    assert "bad_claim:c4" not in report and "| bad_claim | " in report
    assert "stopped: slow_cell:c2 timed out after 4 s" in report
    assert "not finished (deadline, at c" in report and "not run (--no-tests)" in report
    assert "**bad_claim:c3**" in report and "skipped: no CUDA GPU here" in report
    assert "gpu-record.json" in report and (tmp_path / "out" / "gpu-record.json").read_text() == '{"x": 1}\n'
    assert "RESULT: FAIL (2 cell errors, 2 notebooks not finished)" in report
    assert "x is 2" in (tmp_path / "out" / "tracebacks.txt").read_text()


def test_the_gpu_tests_are_found_from_their_marks():
    ids = gpu_check.default_test_ids()
    assert "tests/tools/test_amp.py::test_op_dtypes_on_cuda_gives_cudas_float16_policy" in ids
    assert "tests/tools/test_diagnose.py::test_cuda_rng_is_restored" in ids
    assert set(gpu_check.GPU_TEST_FILES) <= set(ids)
    assert "-x" not in gpu_check.pytest_command(ids, 100)


@pytest.mark.parametrize("path, label", [("notebooks/07_ddp.ipynb", "07"), ("notebooks/04_cnn_training.ipynb", "04"),
                                         ("notebooks/04_finetuning_and_bugs.ipynb", "04b"),
                                         ("notebooks/solutions/06_amp.ipynb", "sol06")])
def test_labels_use_the_course_notation(path, label):
    assert gpu_check.notebook_label(ROOT / path) == label
    assert gpu_check.cell_label(ROOT / path, 72) == f"{label}:c72"


def test_the_lanes_take_the_slowest_notebooks_first():
    paths = sorted((ROOT / "notebooks").rglob("*.ipynb"))
    order = [gpu_check.notebook_label(p) for p in gpu_check.slowest_first(paths)]
    assert order[:3] == ["08", "07", "03"] and all(label.startswith("sol") for label in order[-8:])
    assert gpu_check.default_lanes(16) == 4 and gpu_check.default_lanes(2) == 1 and gpu_check.default_lanes(8) == 2


def test_missing_packages_are_named_with_the_fix(tmp_path):
    lines = gpu_env.fix_lines(gpu_env.missing_modules({"no_such_module_here", "json", "nbformat"}), tmp_path)
    assert lines[0] == "missing: no_such_module_here (pip: no-such-module-here)"
    assert "make gpu-wheels" in lines[1] and "pip install --no-index --find-links .gpu-wheels" in lines[1]
    (tmp_path / ".gpu-wheels").mkdir()
    (tmp_path / ".gpu-wheels" / "requirements.txt").write_text("nbclient==0.11.0\n")
    assert "not in .gpu-wheels: no-such-module-here" in gpu_env.fix_lines(["no_such_module_here"], tmp_path)[-1]


def _gpu_wheels():
    spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "tools" / "gpu_wheels.py")
    module = sys.modules["gpu_wheels"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_wheelhouse_carries_the_runner_at_the_locked_pins_and_nothing_torch_brings():
    wheels = _gpu_wheels()
    pins = wheels.read_lock(ROOT / "requirements.lock")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    roots = re.search(r"^GPU_WHEELS \?= (.*)$", makefile, re.M).group(1).split()
    carried = {p.name: p.spec for p in wheels.carried(pins, roots, wheels.TARGET_ENV)}
    assert {"nbclient", "nbformat", "nbval", "ipykernel", "ipywidgets", "jupyter-client", "pyzmq", "traitlets",
            "pytest", "pytest-timeout"} <= set(carried)
    assert not {"torch", "torchvision", "triton", "numpy", "pillow", "typing-extensions", "jinja2"} & set(carried)
    assert not any(name.startswith(("nvidia-", "cuda-")) for name in carried)
    assert carried["ipykernel"] == "ipykernel==7.4.0"   # the pin the lock takes for Python 3.12
    assert all(p.hashes for p in pins)


def test_make_has_the_two_gpu_targets_and_ignores_what_they_write():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("gpu-check", "gpu-wheels"):
        assert f"\n{target}:" in makefile and f'@echo "make {target} ' in makefile
    assert re.search(r"^gpu-check:\n\t.*-m ptlab gpu-check$", makefile, re.M)
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert ".gpu-wheels/" in ignored and "gpu-report/" in ignored


def test_the_command_line_defaults_are_the_budgeted_ones(monkeypatch):
    from ptlab.__main__ import build_parser

    monkeypatch.delenv("OUT", raising=False)
    args = build_parser().parse_args(["gpu-check"])
    assert (args.cell_timeout_s, args.deadline_s, args.tests_s) == (gpu_check.CELL_TIMEOUT_S, gpu_check.DEADLINE_S,
                                                                    gpu_check.TESTS_S)
    assert args.deadline_s + gpu_check.GRACE_S < 8 * 60 and args.deadline_s - args.tests_s >= 1.5 * 167
    assert args.out == "gpu-report" and args.lanes == 0 and not args.allow_cpu
