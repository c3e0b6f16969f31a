"""Chapter 6's new pitfall lines are able to fail on the bug they are about (round-3 review and its gaps)."""
import torch

from ptlab.lessons.ch06_amp import pitfalls_dtypes, pitfalls_resume


def test_scaler_state_fixed_lines_fail_when_the_scalers_state_is_not_loaded(monkeypatch):
    """The FIX resumes into a new GradScaler, so a resume that saves its state but never loads it shows the skips."""
    monkeypatch.setattr(torch.amp.GradScaler, "load_state_dict", lambda self, state: None)
    outcome = pitfalls_resume.scaler_state_not_checkpointed(buggy=False)
    assert [check.holds for check in outcome.checks] == [True, True]
    assert outcome.figures["scale after the resume"] == 65536.0


def test_bf16_weights_lines_fail_for_a_model_whose_weights_are_bfloat16_under_autocast_too():
    """Autocast does not save bfloat16 weights: the same steps under autocast still round the updates away."""
    torch.manual_seed(0)
    X, y = pitfalls_dtypes._regression()
    loss, unchanged = pitfalls_dtypes._sgd_steps(torch.nn.Linear(16, 1).to(torch.bfloat16), X, y, autocast=True)
    torch.manual_seed(0)
    reference, _ = pitfalls_dtypes._sgd_steps(torch.nn.Linear(16, 1), X, y, autocast=True)
    assert loss / reference > 10 and unchanged > 0.5


def test_manual_half_keeps_only_the_check_that_can_fail():
    """The loss dtype is a consequence of .half(), printed as a figure; the check is the rounded-away updates."""
    outcome = pitfalls_dtypes.manual_half_vs_autocast(buggy=True)
    assert [check.what for check in outcome.checks] == ["fraction of weights with non-zero grad left unchanged"]
    assert outcome.figures["loss dtype"] == "torch.float16"
