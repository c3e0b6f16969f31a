"""ptlab.watch on code nobody here wrote (tests/watch_corpus/): correct advanced scripts give exit 0, no finding and
the same output as without the watch; each buggy script gives exit 1 naming its pitfall as the cause (or the hint,
or nothing, that its header says); each real-world bug, adapted from the public report its header cites, is caught
with the bug and gives no finding without it, and its symptom is measured both ways.

Every script states what it expects in a `# expect:` line (`clean`, pitfall ids, `hint ID`, `out-of-reach REASON`
or `script-fails`), `# runs:` lists argument variants, `# source:` the report a `real_` script comes from. Most run
in this process (a second each); a few go through the real command line.
"""
from __future__ import annotations

import contextlib
import io
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from ptlab.core import env_importing_this_ptlab
from ptlab.watch import DETECTS, Report, run_script

CORPUS = Path(__file__).resolve().parents[1] / "watch_corpus"


def _header(path: Path, key: str) -> str | None:
    found = re.search(rf"^# {key}: (.*)$", path.read_text(encoding="utf-8"), re.M)
    return found.group(1).strip() if found else None


def _scripts(prefix: str) -> list[Path]:
    return sorted(CORPUS.glob(f"{prefix}_*.py"))


def _cases(prefix: str) -> list[tuple[Path, list[str]]]:
    cases = []
    for path in _scripts(prefix):
        runs = _header(path, "runs")
        cases += [(path, variant.split()) for variant in runs.split("|")] if runs else [(path, [])]
    return cases


@pytest.fixture(autouse=True)
def _one_thread_and_the_corpus_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(CORPUS))        # the scripts import _data, as they do from their folder
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _watched(path: Path, args: list[str]) -> tuple[Report, str, list[str]]:
    """The script under the watch in this process: its report, its output and the warnings it raised."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = run_script(path, args)
    return report, out.getvalue(), [f"{w.category.__name__}: {w.message}" for w in caught]


def _plain(path: Path, args: list[str]) -> tuple[str, list[str]]:
    saved = sys.argv
    sys.argv = [str(path), *args]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv = saved
    return out.getvalue(), [f"{w.category.__name__}: {w.message}" for w in caught]


@pytest.mark.parametrize("script", _scripts("clean"), ids=lambda p: p.stem)
def test_a_correct_script_gives_exit_0_no_finding_and_the_same_output(script):
    assert _header(script, "expect") == "clean"
    plain_out, plain_warnings = _plain(script, [])
    report, out, caught = _watched(script, [])
    assert report.exit_status == 0 and report.findings == [], str(report)
    assert report.steps_observed > 0 or "Nothing trains" in script.read_text(encoding="utf-8")
    assert out == plain_out and caught == plain_warnings       # the watch changes neither output nor warnings


@pytest.mark.parametrize("script, args", _cases("buggy"), ids=lambda v: v.stem if isinstance(v, Path) else " ".join(v))
def test_a_buggy_script_is_reported_as_its_header_says(script, args):
    expect = _header(script, "expect")
    report, _, _ = _watched(script, args)
    if expect.startswith("hint "):
        hinted = [f.pitfall for f in report.findings if f.kind == "hint"]
        assert expect.split()[1] in hinted and report.exit_status == 0, str(report)
    elif expect.startswith("out-of-reach"):
        assert report.exit_status == 0 and report.findings == [], str(report)
        assert "not a verdict that the script is correct" in str(report)
    else:
        expected = set(expect.split())
        assert expected <= set(DETECTS)
        assert {f.pitfall for f in report.causes} == expected, str(report)   # each bug once, no second cause
        assert report.exit_status == 1


@pytest.mark.parametrize("script", _scripts("real"), ids=lambda p: p.stem)
def test_a_real_world_bug_is_caught_with_the_bug_and_silent_without_it(script):
    expect, source = _header(script, "expect"), _header(script, "source")
    assert source and source.split()[0].startswith("http")
    report, out, _ = _watched(script, [])
    if expect.startswith("script-fails"):
        assert report.exit_status == 2 and "Traceback" in out
    else:
        assert {f.pitfall for f in report.causes} == set(expect.split()), str(report)
        assert "symptom shows: True" in out, out                  # the bug's effect, measured
    fixed, fixed_out, _ = _watched(script, ["--fixed"])
    assert fixed.exit_status == 0 and fixed.findings == [], str(fixed)
    assert "symptom shows: False" in fixed_out, fixed_out


def test_the_corpora_are_as_large_as_the_issue_asks():
    clean, real = _scripts("clean"), _scripts("real")
    assert len(clean) >= 25
    sources = {_header(p, "source").split()[0] for p in real}
    assert len(real) >= 12 and len(sources) == len(real)
    caught = [p for p in real if _header(p, "expect").split()[0] in DETECTS]
    assert len(caught) >= 10
    reviewed = ["clean_moco_key_encoder", "clean_mc_dropout", "clean_slow_learner_sgd", "clean_compiled_eager",
                "buggy_no_zero_grad_with_clipping", "buggy_eval_train_mode_with_grad",
                "buggy_class_sorted_small_batch", "buggy_lr_far_too_high", "buggy_mid_run_eval_train_mode"]
    assert all((CORPUS / f"{name}.py").is_file() for name in reviewed)   # the review's nine (ch5.md, K2)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=CORPUS, env=env_importing_this_ptlab(), capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("script, status, lines", [
    ("clean_mc_dropout.py", 0, ["no pitfall found", "not a verdict"]),
    ("buggy_intern_no_zero_grad_no_eval.py", 1,
     ["2 pitfall(s) found, 1 consequence(s) of them", "- missing-zero-grad-training:", "- eval-without-eval-mode:",
      "- learning-rate-too-high: [a consequence of missing-zero-grad-training: the piled-up gradient's norm was "
      ">= 3x"]),
    ("buggy_functional_dropout_in_eval.py", 0, ["no pitfall found", "it does not see other bugs"]),
])
def test_through_the_command_line(script, status, lines):
    done = _cli("-m", "ptlab", "watch", script)
    assert done.returncode == status, done.stdout + done.stderr
    text = done.stdout.replace("\n  ", " ")
    assert all(line in text for line in lines), done.stdout


def test_a_compiled_script_prints_the_same_with_and_without_the_command_line_watch():
    plain = _cli("clean_compiled_eager.py")
    watched = _cli("-m", "ptlab", "watch", "clean_compiled_eager.py")
    assert plain.returncode == watched.returncode == 0, watched.stderr
    assert watched.stdout.startswith(plain.stdout) and "no pitfall found" in watched.stdout[len(plain.stdout):]
    assert watched.stderr == plain.stderr                        # no warning about global hooks
