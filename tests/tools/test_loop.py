"""ptlab.loop and the batch checks of overfit_one_batch: modes, frozen BatchNorm, broken batches."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ptlab.loop import eval_mode, train_mode
from ptlab.overfit import overfit_one_batch
from ptlab.train import evaluate, train_one_epoch


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(64, 4, generator=g) * 3 + 2, torch.randint(0, 3, (64,), generator=g)
    return DataLoader(TensorDataset(X, y), batch_size=16)


def test_train_one_epoch_keeps_a_frozen_batchnorm_frozen():
    model = _bn_model()
    model[1].eval()                                   # the learner freezes BatchNorm statistics
    before = model[1].running_mean.clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_one_epoch(model, _loader(), opt)
    assert torch.equal(model[1].running_mean, before)
    assert model.training and not model[1].training


def test_train_one_epoch_trains_a_model_left_in_eval_mode_and_gives_the_mode_back():
    model = _bn_model().eval()
    before = model[1].running_mean.clone()
    seen = []
    model[1].register_forward_hook(lambda m, i, o: seen.append(m.training))
    train_one_epoch(model, _loader(), torch.optim.SGD(model.parameters(), lr=0.1))
    assert seen and all(seen)                          # trained in training mode
    assert not torch.equal(model[1].running_mean, before)
    assert not any(m.training for m in model.modules())  # and given back in eval mode


def test_evaluate_and_train_one_epoch_agree_on_restoring_modes():
    model = _bn_model()
    model[1].eval()
    modes = [m.training for m in model.modules()]
    evaluate(model, _loader())
    assert [m.training for m in model.modules()] == modes
    train_one_epoch(model, _loader(), torch.optim.SGD(model.parameters(), lr=0.1))
    assert [m.training for m in model.modules()] == modes


def test_mode_context_managers_restore_on_error():
    model = _bn_model()
    model[1].eval()
    for manager in (eval_mode, train_mode):
        with pytest.raises(RuntimeError), manager(model):
            raise RuntimeError("boom")
        assert model.training and not model[1].training


def test_overfit_one_batch_names_non_finite_inputs():
    X, y = torch.randn(8, 4), torch.arange(8) % 3
    X[2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"1 non-finite value"):
        overfit_one_batch(_bn_model(), (X, y))


def test_overfit_one_batch_names_labels_outside_the_outputs():
    X, y = torch.randn(8, 4), torch.tensor([0, 1, 2, 3, 0, 1, 2, 5])
    with pytest.raises(ValueError, match=r"labels run from 0 to 5 but the model has 3 outputs"):
        overfit_one_batch(_bn_model(), (X, y))


def test_overfit_one_batch_notes_a_batch_of_one_class():
    X, y = torch.randn(8, 4), torch.full((8,), 2)
    report = overfit_one_batch(_bn_model(), (X, y), steps=200)
    assert report.passed and "one class" in report.notes
    assert "note: one class: every label in the batch is 2" in str(report)


def test_overfit_one_batch_on_a_healthy_batch_has_no_notes():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(12, 4, generator=g), torch.arange(12) % 3
    report = overfit_one_batch(_bn_model(), (X, y), steps=300, lr=0.05)
    assert report.passed and report.notes == {}
