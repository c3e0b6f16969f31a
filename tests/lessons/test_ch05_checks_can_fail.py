"""Chapter 5's checks are able to fail on the bug they are about (round-3 review, 'checks that cannot fail')."""
from ptlab.lessons.ch05_checkpoints_debugging import pitfalls_checkpoints


def test_model_only_checkpoint_fixed_lines_fail_when_the_resume_restores_nothing(monkeypatch):
    """The FIX resumes into new objects, so a load that restores nothing shows the symptom in the fixed run too."""
    monkeypatch.setattr(pitfalls_checkpoints, "load_checkpoint", lambda *args, **kwargs: None)
    outcome = pitfalls_checkpoints.model_only_checkpoint(buggy=False)
    assert [check.holds for check in outcome.checks] == [True, True]


def test_model_only_checkpoint_fixed_lines_fail_when_the_schedule_is_not_restored(monkeypatch):
    """A resume that restores the model and optimizer but not the scheduler fails the fixed learning-rate line."""
    real_load = pitfalls_checkpoints.load_checkpoint
    monkeypatch.setattr(pitfalls_checkpoints, "load_checkpoint",
                        lambda path, model, opt, sched, **kwargs: real_load(path, model, opt, None, **kwargs))
    outcome = pitfalls_checkpoints.model_only_checkpoint(buggy=False)
    lr_line, drift_line = outcome.checks
    assert lr_line.holds and drift_line.holds


def test_model_only_checkpoint_fixed_run_matches_the_uninterrupted_one():
    outcome = pitfalls_checkpoints.model_only_checkpoint(buggy=False)
    assert not any(check.holds for check in outcome.checks)


def test_the_gradient_bytes_claim_fails_when_a_parameter_gets_no_gradient():
    """05's 'every parameter got a gradient, so the gradients take exactly the parameters' bytes' is a check of
    memory_breakdown that fails for a model with a parameter outside the graph (a head that forward skips)."""
    import torch
    from torch import nn

    from ptlab.memory import memory_breakdown

    class WithUnusedHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.unused = nn.Linear(4, 3), nn.Linear(4, 3)

        def forward(self, x):
            return self.body(x)

    model = WithUnusedHead()
    parts = memory_breakdown(model, torch.optim.AdamW(model.parameters()), (torch.randn(8, 4), torch.zeros(8).long()))
    assert parts.gradients < parts.parameters
