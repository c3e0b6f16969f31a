"""ptlab.watch: each finding's text against the situation it describes (the figure it prints, its cause, "at chance"
only at chance), certain findings against hints and consequences, and what the watch must not change."""
from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ptlab.watch import DETECTS, Report, WatchFinding, run_script, watch
from ptlab.watch.report import mark_consequences
from ptlab.watch.watcher import EXPLAINS

CORPUS = Path(__file__).resolve().parents[1] / "watch_corpus"


def _run(name: str, *args: str) -> Report:
    """A corpus script, in this process, under the watch; its own output swallowed."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return run_script(CORPUS / name, list(args))


@pytest.fixture(autouse=True)
def _corpus_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(CORPUS))


def _finding(report: Report, pitfall: str) -> WatchFinding:
    return next(f for f in report.findings if f.pitfall == pitfall)


def test_exit_status_counts_causes_only():
    hint = WatchFinding("shuffled-labels", "a hint", certain=False)
    cause = WatchFinding("learning-rate-too-high", "a cause", since=3)
    assert Report(findings=[hint]).exit_status == 0
    assert Report(findings=[hint, cause]).exit_status == 1
    assert Report(findings=[cause], script_failed=True).exit_status == 2
    consequence = WatchFinding("learning-rate-too-high", "rose", since=5)
    zero = WatchFinding("missing-zero-grad-training", "piled up", since=1)
    marked = mark_consequences([consequence, zero], EXPLAINS)
    assert [f.kind for f in marked] == ["cause", "consequence"] and consequence.consequence_of == zero.pitfall
    assert Report(findings=marked).causes == [zero]
    late = WatchFinding("missing-zero-grad", "piled up later", since=9)
    assert mark_consequences([WatchFinding("learning-rate-too-high", "rose", since=5), late], EXPLAINS)[1].kind \
        == "cause"                                  # a cause that began after the symptom does not explain it


def test_the_exit_0_line_says_what_was_looked_for():
    text = str(Report(steps_observed=7, looked_for=list(DETECTS)))
    assert text.startswith("ptlab watch: 7 optimizer steps observed, no pitfall found")
    assert f"signs of {len(DETECTS)} pitfalls" in text and "not a verdict" in text
    assert all(pitfall in text.replace("\n  ", " ").replace("- ", "-") for pitfall in DETECTS)
    hints_only = str(Report(findings=[WatchFinding("shuffled-labels", "x", certain=False)], looked_for=["a"]))
    assert "no pitfall found for certain" in hints_only and "hints" in hints_only and "not a verdict" in hints_only


def test_a_non_finite_loss_text_claims_only_the_forward_passes_checked():
    last = _finding(_run("buggy_lr_far_too_high.py", "--steps", "9"), "exploding-gradients-nan")
    assert re.search(r"became (inf|nan) at step 9, from finite inputs after rising from 36.7 to", last.message)
    assert "module" not in last.message and last.evidence["forward passes checked"] == 0   # none ran after it
    later = _finding(_run("buggy_lr_far_too_high.py", "--steps", "20"), "exploding-gradients-nan")
    assert later.evidence["first non-finite module"] == "Sequential[2] (Linear)"
    assert later.message.endswith("the first module whose output was non-finite was Sequential[2] (Linear) (its own "
                                  "weights were still finite)")


def test_at_chance_is_said_only_near_chance():
    report = _run("buggy_intern_no_zero_grad_no_eval.py")
    assert "shuffled-labels" not in report.pitfalls                   # a loss of about 1e5 is not "at chance"
    assert report.causes == [f for f in report.findings if f.pitfall in ("missing-zero-grad-training",
                                                                             "eval-without-eval-mode")]
    assert _finding(report, "learning-rate-too-high").consequence_of == "missing-zero-grad-training"
    hint = _finding(_run("buggy_labels_permuted_separately.py"), "shuffled-labels")
    loss, chance = (float(v) for v in re.search(r"still ([\d.]+) .* = ([\d.]+), the labels", hint.message).groups())
    assert hint.kind == "hint" and abs(loss / chance - 1) <= 0.05
    assert hint.evidence["weights moved (relative)"] >= 0.2


def test_zero_grad_before_step_names_the_cause_not_the_labels():
    report = _run("buggy_intern_zero_grad_order.py")
    assert report.pitfalls == ["zero-grad-after-backward"]
    assert "all 4 .grad were None" in report.findings[0].message
    assert report.findings[0].evidence["zero_grad at"].endswith("buggy_intern_zero_grad_order.py:19")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(32, 8, generator=g), torch.randint(0, 4, (32,), generator=g)) for _ in range(n)]


def test_the_running_total_text_says_whether_each_loss_was_backpropagated():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch() as trained:
        total = 0
        for X, y in _batches(6):
            loss = F.cross_entropy(model(X), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total = total + loss
    text = _finding(trained, "running-loss-keeps-graph").message
    assert "each of those losses was backpropagated on its own, which freed the activations" in text
    model.eval()
    with watch() as validated:
        total = 0
        for X, y in _batches(4):
            total = total + F.cross_entropy(model(X), y)
    text = _finding(validated, "running-loss-keeps-graph").message
    assert "keeps every one of those graphs alive, with the activations they saved" in text


def test_the_running_mean_change_is_that_of_the_evaluation_pass_alone():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = _batches(60)
    with watch() as report:
        for i, (X, y) in enumerate(batches):
            loss = F.cross_entropy(model(X), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == 9:
                before = model[1].running_mean.clone()
                with torch.no_grad():
                    model(batches[0][0] * 3)                            # an evaluation left in train mode
                measured = (model[1].running_mean - before).abs().max().item()
    found = _finding(report, "eval-without-eval-mode")
    assert found.evidence["running_mean moved by (max), first pass"] == pytest.approx(measured, rel=1e-6)
    assert f"moved its running_mean by up to {measured:.3g}" in found.message
    assert found.evidence["after steps"] == [10]


def test_torch_compile_prints_the_same_warnings_with_and_without_the_watch():
    def run() -> list[str]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        compiled = torch.compile(model, backend="eager")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                compiled(torch.randn(3, 4)).sum().backward()
        return [str(w.message) for w in caught]

    plain = run()
    with watch():
        watched = run()
    assert watched == plain and not any("global hooks" in text for text in watched)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)   # the script's own hook
    try:
        with watch():
            assert any("global hooks" in text for text in run())                       # still warns, as without
    finally:
        handle.remove()


def test_a_step_that_raises_leaves_the_function_mode_as_it_was():
    from torch.overrides import _get_current_function_mode_stack

    class Failing(torch.optim.SGD):
        @torch.no_grad()
        def step(self, closure=None):
            raise RuntimeError("boom in step")

    model = nn.Linear(2, 1)
    before = len(_get_current_function_mode_stack())
    with pytest.raises(RuntimeError, match="boom in step"):
        with watch():
            model(torch.randn(4, 2)).sum().backward()
            Failing(model.parameters(), lr=0.1).step()
    assert len(_get_current_function_mode_stack()) == before
