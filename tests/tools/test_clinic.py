"""ptlab.clinic: the first non-finite module is named on hand-made broken models; the lr range test's range."""
import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from ptlab.clinic import first_nonfinite, lr_range_test


class LogOfNegative(nn.Module):
    def forward(self, x):
        return torch.log(x - 10)  # every input below 10 gives NaN


def test_the_first_broken_module_is_named():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), LogOfNegative()), nn.Linear(4, 2))
    found = first_nonfinite(model, torch.randn(8, 4))
    assert found.where == "1.1" and found.module_type == "LogOfNegative" and found.nan > 0
    assert "first non-finite output: 1.1 (LogOfNegative)" in str(found)


def test_an_overflowing_weight_is_named_before_what_follows_it():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    with torch.no_grad():
        model[0].weight.fill_(3e38)
    found = first_nonfinite(model, torch.ones(2, 4))
    assert found.where == "0" and found.inf > 0


def test_a_poisoned_input_is_blamed_on_the_data_and_a_healthy_model_passes():
    model = nn.Linear(4, 2)
    X = torch.randn(8, 4)
    assert first_nonfinite(model, X) is None
    X[3, 1] = float("nan")
    found = first_nonfinite(model, X)
    assert found.where == "input" and found.nan == 1 and "the data, not the model" in str(found)


def test_lr_range_test_finds_a_range_below_divergence_and_leaves_the_model_alone():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(512, 10, generator=g)
    y = (X[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True, generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
    before = [p.clone() for p in model.parameters()]
    result = lr_range_test(model, loader, lambda p: torch.optim.SGD(p, lr=0.0), start_lr=1e-4, end_lr=1e3, steps=80)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert result.diverged_at is not None and result.best_lr < result.diverged_at
    low, high = result.suggested
    assert low < high <= result.best_lr and min(result.smoothed) < result.smoothed[0]
    assert "try a peak lr between" in str(result) and result.plot().axes[0].get_xscale() == "log"


def test_bad_ranges_are_named():
    with pytest.raises(ValueError, match="start_lr < end_lr"):
        lr_range_test(nn.Linear(1, 1), [], torch.optim.SGD, start_lr=1.0, end_lr=0.1)


def test_every_clinic_row_links_to_pitfalls_that_exist():
    from ptlab.lessons.ch05_checkpoints_debugging.clinic_table import CLINIC, ClinicRow, ClinicTable, clinic_table
    from ptlab.course.pitfalls import all_pitfalls

    table = clinic_table()
    known = {p.id for p in all_pitfalls()}
    assert all(pid in known for row in CLINIC for pid in row.pitfalls)
    assert len(CLINIC) >= 9 and "(ch5)" in repr(table) and "<table" in table._repr_html_()
    with pytest.raises(KeyError, match="no-such-pitfall"):
        ClinicTable((ClinicRow("s", "c", "k", ("no-such-pitfall",)),))


class LogInForward(nn.Module):
    """Every submodule's output is finite; the log in this forward's own code makes the NaN."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return torch.log(self.head(self.body(x)))


def test_a_nan_made_by_a_function_call_in_forward_is_blamed_on_that_forward():
    torch.manual_seed(0)
    found = first_nonfinite(LogInForward(), torch.randn(8, 4))
    assert found is not None, "the model's output is NaN, yet every module looked fine"
    assert (found.where, found.module_type, found.between) == ("", "LogInForward", ("head", None)) and found.nan > 0
    assert str(found).startswith("made inside the forward of the model (LogInForward) after head: its output holds")
    torch.manual_seed(0)
    found = first_nonfinite(nn.Sequential(nn.Identity(), LogInForward()), torch.randn(8, 4))
    assert (found.where, found.between) == ("1", ("1.head", None))
    assert "inside the forward of module 1 (LogInForward) after 1.head" in str(found)


class ExpBetween(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 2)
        with torch.no_grad():
            self.first.weight.fill_(100.0)

    def forward(self, x):
        return self.second(torch.exp(self.first(x)))  # exp(400) overflows float32: inf before `second`


def test_an_inf_made_between_two_children_is_blamed_on_the_parent_not_the_next_child():
    found = first_nonfinite(ExpBetween(), torch.ones(2, 4))
    assert found.where != "second", "second only received the inf"
    assert (found.where, found.module_type, found.between) == ("", "ExpBetween", ("first", "second"))
    assert found.inf == 8 and found.nan == 0
    assert str(found) == ("made inside the forward of the model (ExpBetween) between first and second: "
                          "second received 0 NaN and 8 inf values that no submodule produced")


def test_first_nonfinite_leaves_a_train_mode_model_and_the_random_generators_as_they_were():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), LogOfNegative(),
                          nn.BatchNorm1d(4)).train()
    X = torch.randn(8, 4)
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    assert first_nonfinite(model, X).where == "3"
    changed = [k for k, v in buffers.items() if not torch.equal(v, model.state_dict()[k])]
    assert not changed, "the pass updated the BatchNorm statistics"
    assert torch.equal(torch.get_rng_state(), rng), "the pass drew from the global generator (Dropout)"
    assert model.training


def test_lr_range_test_leaves_the_loader_generator_and_the_global_generator_as_they_were():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(256, 10, generator=g), torch.randint(0, 2, (256,), generator=g)
    model = nn.Sequential(nn.Linear(10, 16), nn.Dropout(0.2), nn.Linear(16, 2))
    data = TensorDataset(X, y)
    for loader in (DataLoader(data, batch_size=32, shuffle=True, generator=g),
                   DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data, generator=g), 32, False)),
                   DataLoader(data, batch_size=32, shuffle=True)):  # this sampler seeds itself from torch's
        loader_state, rng = g.get_state(), torch.get_rng_state()
        lr_range_test(model, loader, lambda p: torch.optim.SGD(p, lr=0.0), steps=12)
        assert torch.equal(g.get_state(), loader_state), "the loader's generator moved on"
        assert torch.equal(torch.get_rng_state(), rng), "the global generator moved on"


class ParametersOnMeta(nn.Module):
    """Parameters on the meta device, a stand-in for a GPU on this CPU-only machine."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, 10, device="meta"))

    def forward(self, x):
        assert x.device == self.weight.device, f"batch on {x.device}, parameters on {self.weight.device}"
        return torch.zeros(len(x), 2, requires_grad=True)  # a real number to record (meta tensors have none)


def test_lr_range_test_moves_each_batch_to_the_device_of_the_parameters():
    loader = DataLoader(TensorDataset(torch.randn(64, 10), torch.randint(0, 2, (64,))), batch_size=16)

    def loss_fn(out, y):
        assert y.device.type == "meta", f"labels on {y.device}, parameters on meta"
        return out.sum()

    result = lr_range_test(ParametersOnMeta(), loader, lambda p: torch.optim.SGD(p, lr=0.0), steps=6,
                           loss_fn=loss_fn)
    assert len(result.lrs) == 6


def test_the_range_test_reports_its_step_count_as_measured_only_when_the_loss_took_off():
    from ptlab.clinic import LRRangeResult

    diverged = LRRangeResult(lrs=[0.1, 1.0, 10.0], losses=[1, 1, 1], smoothed=[1, 0.9, 0.8], diverged_at=30.0)
    assert "over ≈3 steps" in str(diverged)
    assert "over 3 steps" in str(LRRangeResult(lrs=[0.1, 1.0, 10.0], losses=[1, 1, 1], smoothed=[1, 0.9, 0.8]))
