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
    zero = WatchFinding("missing-zero-grad-training", "piled up", since=1, explains_from=4)
    marked = mark_consequences([consequence, zero], EXPLAINS)
    assert [f.kind for f in marked] == ["cause", "consequence"] and consequence.consequence_of == zero.pitfall
    assert Report(findings=marked).causes == [zero]
    late = WatchFinding("missing-zero-grad", "piled up later", since=1, explains_from=9)
    assert mark_consequences([WatchFinding("learning-rate-too-high", "rose", since=5), late], EXPLAINS)[1].kind \
        == "cause"                                  # a pile that grew only after the symptom began does not explain it
    small = WatchFinding("missing-zero-grad", "piled up, never grew 3x", since=1)
    assert mark_consequences([WatchFinding("learning-rate-too-high", "rose", since=5), small], EXPLAINS)[1].kind \
        == "cause"                                  # nothing measured that it explains the rise


def test_the_exit_0_line_says_what_was_looked_for():
    text = str(Report(steps_observed=7, looked_for=list(DETECTS)))
    assert text.startswith("ptlab watch: 7 optimizer steps observed, no pitfall found")
    assert f"signs of {len(DETECTS)} pitfalls" in text and "not a verdict" in text
    assert all(pitfall in text.replace("\n  ", " ").replace("- ", "-") for pitfall in DETECTS)
    hints_only = str(Report(findings=[WatchFinding("shuffled-labels", "x", certain=False)], looked_for=["a"]))
    assert "no pitfall found for certain" in hints_only and "hints" in hints_only and "not a verdict" in hints_only


def test_a_non_finite_loss_text_claims_only_the_forward_passes_checked():
    last = _finding(_run("buggy_lr_far_too_high.py", "--steps", "9"), "exploding-gradients-nan")
    assert re.search(r"became (inf|nan) at step 9, from finite inputs and targets after rising from 36.7 to",
                     last.message)
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


# --- the review of every finding's text (each FALSE or MISLEADING row, the situation that made it so) ---------------

def test_the_pile_text_says_what_clip_and_unscale_did_to_it():
    unscaled = _finding(_run("buggy_no_zero_grad_scaler_unscale.py"), "missing-zero-grad-training")
    assert "GradScaler.unscale_ divided all of it by the scale (last 256)" in unscaled.message
    assert "sum of every gradient" not in unscaled.message
    clipped = _finding(_run("buggy_no_zero_grad_with_clipping.py"), "missing-zero-grad-training")
    assert "scaled down again by each clip_grad_norm_ that clipped it" in clipped.message
    assert "sum of every gradient" not in clipped.message


def test_a_running_total_of_retained_graphs_is_not_said_to_have_freed_them():
    found = _finding(_run("buggy_running_total_retain_graph.py"), "running-loss-keeps-graph")
    assert "keeps every one of those graphs alive, with the activations they saved (10 of them were backpropagated " \
           "with retain_graph=True, which frees nothing)" in found.message
    assert "freed the activations" not in found.message


def test_a_validation_call_is_placed_after_the_last_step_not_at_the_next():
    report = _run("real_double_softmax_validation.py")
    found = _finding(report, "softmax-before-cross-entropy")
    # its first validation pass runs after epoch 1's 32 steps (1024 samples, batches of 32), under no_grad
    assert report.steps_observed == 64 and "cross_entropy after optimizer step 32 got" in found.message
    assert "step 33" not in found.message


def test_the_dataloader_is_named_only_when_it_fed_the_training_batches():
    slices = _finding(_run("buggy_sorted_slices_after_val_loader.py"), "shuffle-off-for-training")
    assert "DataLoader" not in slices.message and slices.message.endswith("the training data comes one class at a time")
    loader = _finding(_run("buggy_sorted_and_lr_too_high.py"), "shuffle-off-for-training")
    assert loader.message.endswith("(its DataLoader has shuffle=False)")


def test_the_at_chance_hint_counts_optimizer_steps_not_loss_calls():
    report = _run("buggy_labels_permuted_accumulated.py")
    hint = _finding(report, "shuffled-labels")
    assert report.steps_observed == 100 and hint.kind == "hint"
    assert hint.message.startswith("after 100 optimizer steps (400 cross-entropy calls) the training cross-entropy")
    assert "labels do not belong to their inputs" in hint.message and "has not learned the task yet" in hint.message


def test_a_nan_late_in_the_run_is_found_and_no_figure_reads_nan_percent():
    report = _run("buggy_nan_input_after_400_forwards.py")
    assert report.pitfalls == ["nan-from-a-poisoned-sample"], str(report)
    assert report.findings[0].message == ("the input batch of Sequential after optimizer step 150 held 1 NaN/inf "
                                          "value(s)")
    assert "nan%" not in str(report)


def test_the_weights_moved_figure_is_measured_at_the_last_watched_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))     # every tensor <= 512 values: exact
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    g = torch.Generator().manual_seed(0)
    with watch(steps=60) as report:
        for step in range(200):
            X, y = torch.randn(64, 8, generator=g), torch.randint(0, 4, (64,), generator=g)   # labels unrelated
            loss = F.cross_entropy(model(X), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step + 1 == 60:
                now = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                at_60 = float((now - start).norm() / start.norm())
    end = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert float((end - start).norm() / start.norm()) > 1.2 * at_60          # it moved on after the watched steps
    hint = _finding(report, "shuffled-labels")
    assert hint.evidence["weights moved (relative)"] == pytest.approx(at_60, rel=1e-4)
    assert f"changed the weights by {at_60:.0%} of their norm" in hint.message


def test_a_nan_target_is_a_poisoned_sample_not_an_explosion():
    report = _run("buggy_nan_regression_target.py")
    assert report.pitfalls == ["nan-from-a-poisoned-sample"], str(report)
    assert report.findings[0].message == "the target of mse_loss after optimizer step 19 held 1 NaN/inf value(s)"


def test_a_non_finite_loss_says_it_rose_only_when_it_did():
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    X, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    finite = []
    with watch() as report:
        for step in range(12):
            loss = F.cross_entropy(model(X), y) * (float("inf") if step == 11 else 1.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
            finite.append(loss.item())
    assert finite[10] < finite[0]                                        # it fell, then became inf
    found = _finding(report, "exploding-gradients-nan")
    assert "rising" not in found.message and found.kind == "hint"          # no gradient grew: not named as a cause
    assert f"(its last finite value was {finite[10]:.3g}, and it had not risen before)" in found.message


def test_the_eval_graph_text_counts_the_outputs_it_found_alive_together():
    found = _finding(_run("buggy_eval_keeps_logits_with_grad.py"), "eval-without-no-grad")
    assert found.message.startswith("8 forward passes") and found.evidence["forwards"] == 8     # 256 / 32 batches


def test_a_model_with_no_weights_of_its_own_is_not_said_to_hold_non_finite_ones():
    found = _finding(_run("buggy_exp_overflow_custom_model.py"), "exploding-gradients-nan")
    assert found.message.endswith("the first module whose output was non-finite was Net (Net) (it has no "
                                  "parameters of its own; no module that returned before it in that pass gave a "
                                  "non-finite tensor)")
    two = _finding(_run("buggy_lr_two_modules.py"), "exploding-gradients-nan")       # an activation is no sample
    assert "input batch" not in two.message


def test_a_rising_loss_states_its_figures_not_that_each_update_made_it_worse():
    found = _finding(_run("buggy_adam_lr_far_too_high.py"), "learning-rate-too-high")
    first, last = found.evidence["first loss"], found.evidence["last 5 steps"]
    assert found.message.endswith(f"still {last:.3g} over its last 5 steps, {last / first:.3g}x where it started")
    assert "each update" not in found.message


def _evaluated_after_30_steps_with_5_watched():
    """30 training steps under watch(steps=5), then one evaluation without model.eval(): the report."""
    torch.manual_seed(0)
    X, y = torch.randn(256, 8), torch.randint(0, 4, (256,))
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch(steps=5) as report:
        for step in range(30):
            loss = F.cross_entropy(model(X[:64]), y[:64])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():                                           # an evaluation without model.eval()
            model(X[64:])
    return report


def test_a_pass_after_the_watched_steps_is_placed_after_the_step_it_followed():
    report = _evaluated_after_30_steps_with_5_watched()
    found = _finding(report, "eval-without-eval-mode")
    assert report.steps_observed == 5 and found.evidence["after steps"] == [30]
    assert "after step(s) 30;" in found.message and "after step(s) 5" not in found.message


def test_a_sign_is_marked_a_consequence_only_where_the_figures_say_so():
    both = _run("buggy_sorted_and_lr_too_high.py")
    assert [(f.pitfall, f.kind) for f in both.findings] == [("shuffle-off-for-training", "cause"),
                                                            ("learning-rate-too-high", "hint")], str(both)
    assert _finding(both, "learning-rate-too-high").message.endswith(
        "(shuffle-off-for-training, found above, can do this too, and nothing here measured which one did)")
    control = _run("buggy_sorted_and_lr_too_high.py", "--shuffled")
    assert control.pitfalls == ["learning-rate-too-high"]                     # it rises with shuffled data too
    intern = _run("buggy_intern_no_zero_grad_no_eval.py")
    cause, rise = _finding(intern, "missing-zero-grad-training"), _finding(intern, "learning-rate-too-high")
    grown = cause.evidence["grad norm >= 3x that of the step's own gradient at step"]
    assert rise.consequence_of == cause.pitfall and grown is not None and grown < rise.since
    assert (f"the piled-up gradient's norm was >= 3x that of its step's own gradient from step {grown}, before this "
            f"began at step {rise.since}") in str(intern)


def test_a_rise_the_pile_did_not_cause_is_no_consequence_of_it():
    both = _run("buggy_adam_lr_no_zero_grad.py")          # review 2, C3: lr 10 and no zero_grad()
    assert {(f.pitfall, f.kind) for f in both.findings} == {("missing-zero-grad-training", "cause"),
                                                            ("learning-rate-too-high", "cause")}, str(both)
    assert "[a consequence" not in str(both)
    assert _run("buggy_adam_lr_no_zero_grad.py", "--zero-grad").pitfalls == ["learning-rate-too-high"]


def test_a_later_evaluation_counts_every_training_iteration_not_the_watched_ones():
    report = _evaluated_after_30_steps_with_5_watched()
    found = _finding(report, "eval-without-eval-mode")
    assert "1 of its 30 training iterations" in found.message and found.evidence["training iterations"] == 30


def test_the_at_chance_threshold_is_stated_as_the_code_counts_it():
    import ptlab.watch as module
    from ptlab.watch.losses import LossCalls
    assert "after >= 50 cross-entropy calls" in module.__doc__ and "50 optimizer steps" not in module.__doc__
    assert "after >= 50 cross-entropy calls" in LossCalls.AT_CHANCE.sign
