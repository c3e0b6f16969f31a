"""SmallCNN and the reference loop: shapes, learning on a toy problem, modes restored, clear errors."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ptlab.models import SmallCNN, count_parameters
from ptlab.train import History, evaluate, fit, train_one_epoch


def separable_loaders(n: int = 256, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """Two Gaussian blobs in 2-D, linearly separable; train and test loaders."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    X = torch.randn(n, 2, generator=g) * 0.5 + (y[:, None] * 2 - 1) * torch.tensor([2.0, -1.0])
    train = DataLoader(TensorDataset(X[: n // 2], y[: n // 2]), batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    test = DataLoader(TensorDataset(X[n // 2:], y[n // 2:]), batch_size=64)
    return train, test


def test_small_cnn_shapes_and_size() -> None:
    model = SmallCNN()
    assert model(torch.zeros(4, 3, 32, 32)).shape == (4, 10)
    assert model(torch.zeros(2, 3, 48, 40)).shape == (2, 10)  # global pooling: any image size
    assert SmallCNN(num_classes=3, width=8)(torch.zeros(1, 3, 32, 32)).shape == (1, 3)
    assert 50_000 < count_parameters(model) < 200_000
    with pytest.raises(ValueError, match="width"):
        SmallCNN(width=0)


def test_fit_learns_a_separable_problem() -> None:
    torch.manual_seed(0)
    train, test = separable_loaders()
    model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    before = evaluate(model, test)["acc"]
    history = fit(model, train, test, torch.optim.SGD(model.parameters(), lr=0.1), epochs=5, progress=False)
    assert isinstance(history, History) and len(history) == 5
    assert history.epoch == [1, 2, 3, 4, 5]
    assert history.val_acc[-1] >= 0.95 and history.val_acc[-1] > before
    assert history.train_loss[-1] < history.train_loss[0]
    assert all(s > 0 for s in history.seconds) and history.total_seconds > 0
    assert set(history.as_dict()) == {"epoch", "train_loss", "train_acc", "val_loss", "val_acc", "seconds",
                                      "best_epoch", "stopped_early"}
    assert history.best_epoch == history.epoch[history.val_acc.index(max(history.val_acc))]
    assert not history.stopped_early


def test_fit_with_time_budget_and_batch_scheduler() -> None:
    train, test = separable_loaders()
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)
    history = fit(model, train, test, opt, time_budget_s=0.2, progress=False, scheduler=sched, scheduler_step="batch")
    # Every epoch but the last started inside the budget; the last may run over it (a stall of the
    # machine, a garbage collection) but no epoch starts after the budget is spent.
    assert len(history) >= 1 and sum(history.seconds[:-1]) <= 0.2
    assert sched.last_epoch == len(history) * len(train)
    history = fit(model, train, test, opt, epochs=2, time_budget_s=60, progress=False)
    assert len(history) == 2  # whichever limit comes first


def test_train_one_epoch_reports_and_limits_batches() -> None:
    train, _ = separable_loaders()
    model = nn.Linear(2, 2)
    out = train_one_epoch(model, train, torch.optim.SGD(model.parameters(), lr=0.1), max_batches=3)
    assert out["batches"] == 3 and out["n"] == 48
    assert 0.0 <= out["acc"] <= 1.0 and out["loss"] > 0
    assert model.training


def test_evaluate_restores_modes_and_needs_no_grad() -> None:
    model = nn.Sequential(nn.Linear(2, 4), nn.Dropout(0.5), nn.BatchNorm1d(4), nn.Linear(4, 2))
    _, test = separable_loaders()
    model.train()
    model[2].eval()  # a frozen BatchNorm inside a training model: mixed modes must survive
    seen_modes = []
    model.register_forward_hook(lambda m, i, o: seen_modes.append((m.training, torch.is_grad_enabled())))
    evaluate(model, test)
    assert set(seen_modes) == {(False, False)}
    assert model.training and model[1].training and not model[2].training
    model.eval()
    evaluate(model, test)
    assert not model.training


def test_evaluate_is_deterministic_for_a_fixed_model() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    _, test = separable_loaders()
    assert evaluate(model, test) == evaluate(model, test)  # dropout is off in eval mode


def test_bad_inputs_raise_clear_errors() -> None:
    train, test = separable_loaders()
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="epochs, time_budget_s"):
        fit(model, train, test, opt, progress=False)
    with pytest.raises(ValueError, match="epochs must be"):
        fit(model, train, test, opt, epochs=0, progress=False)
    with pytest.raises(ValueError, match="time_budget_s must be"):
        fit(model, train, test, opt, time_budget_s=-1, progress=False)
    with pytest.raises(ValueError, match="scheduler_step"):
        fit(model, train, test, opt, epochs=1, scheduler_step="step", progress=False)
    empty = DataLoader(TensorDataset(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long)), batch_size=4)
    with pytest.raises(ValueError, match="empty"):
        train_one_epoch(model, empty, opt)
    with pytest.raises(ValueError, match="no batches"):
        evaluate(model, iter([]))  # a generator has no len(): caught after the loop
    with pytest.raises(TypeError, match="model must be"):
        evaluate(lambda x: x, test)
    with pytest.raises(TypeError, match="optimizer must be"):
        train_one_epoch(model, train, "sgd")
    with pytest.raises(TypeError, match="iterable of"):
        evaluate(model, torch.zeros(4, 2))
    with pytest.raises(TypeError, match=r"\(inputs, targets\) pairs"):
        evaluate(model, [torch.zeros(4, 2)])
    with pytest.raises(ValueError, match="logits of shape"):
        evaluate(nn.Flatten(0), [(torch.zeros(4, 2), torch.zeros(8, dtype=torch.long))], loss_fn=lambda o, y: o.sum())


def test_plot_returns_a_figure_and_leaves_nothing_open() -> None:
    import matplotlib.pyplot as plt

    train, test = separable_loaders()
    model = nn.Linear(2, 2)
    open_before = plt.get_fignums()
    history = fit(model, train, test, torch.optim.SGD(model.parameters(), lr=0.1), epochs=2, progress=False)
    fig = history.plot(title="toy")
    assert isinstance(fig, matplotlib.figure.Figure) and len(fig.axes) == 2
    assert plt.get_fignums() == open_before


def calibrated_run(epochs: int = 5, seed: int = 0) -> tuple[History, float]:
    """The chapter 4 recipe (04_cnn_training.ipynb, section 5): SmallCNN at width 24, AdamW + OneCycleLR (peak 1e-2),
    batch 32, crop + flip per batch (augment_collate), trained on the training part of a 90/10 stratified split and
    validated on the rest; returns the history and the test accuracy."""
    from torch.utils.data import Subset

    from ptlab.data import EmbeddedImages, augment_collate, make_transform, train_val_split
    from ptlab.train import evaluate

    torch.manual_seed(seed)
    raw_train = EmbeddedImages(train=True)                               # uint8 images: augment_collate does the rest
    val_source = EmbeddedImages(train=True, transform=make_transform(augment=False))
    test_set = EmbeddedImages(train=False, transform=make_transform(augment=False))
    train_idx, val_idx = train_val_split(raw_train.targets, val_fraction=0.1, seed=0)
    train_loader = DataLoader(Subset(raw_train, train_idx), batch_size=32, shuffle=True, collate_fn=augment_collate,
                              generator=torch.Generator().manual_seed(seed))
    val_loader = DataLoader(Subset(val_source, val_idx), batch_size=500)
    torch.manual_seed(seed)
    model = SmallCNN(width=24)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=epochs * len(train_loader))
    history = fit(model, train_loader, val_loader, optimizer, epochs=epochs, scheduler=scheduler,
                  scheduler_step="batch", progress=False)
    return history, evaluate(model, DataLoader(test_set, batch_size=500))["acc"]


@pytest.mark.slow
def test_small_cnn_difficulty_contract() -> None:
    """The embedded dataset is neither trivial nor hopeless: 80-95% validation and test accuracy with the chapter 4
    recipe, the test split evaluated once at the end."""
    history, test_accuracy = calibrated_run()
    for i in range(len(history)):
        print(f"epoch {history.epoch[i]}: train acc {history.train_acc[i]:.3f} val acc {history.val_acc[i]:.3f} "
              f"({history.seconds[i]:.1f} s)")
    assert 0.80 <= history.val_acc[-1] <= 0.95
    assert 0.80 <= test_accuracy <= 0.95


def test_a_batch_scheduler_is_not_stepped_when_the_grad_scaler_skips_the_optimizer_step() -> None:
    """The chapter 6 pitfall (scheduler-on-skipped-steps) must not be in the course's own loop: a scale so high
    that the first scaled gradients overflow makes GradScaler skip optimizer.step(); the scheduler waits too."""
    import warnings

    train, test = separable_loaders()
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)     # 8 x the loss x 2**127 overflows float32 (2**128)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, train, test, opt, epochs=1, loss_fn=lambda logits, y: 8 * nn.functional.cross_entropy(logits, y),
            scheduler=sched, scheduler_step="batch", scaler=scaler, progress=False)
    steps_taken = int(opt.state[model.weight]["step"])             # Adam counts the steps it really took
    assert 0 < steps_taken < len(train)                            # some steps were skipped, not all
    assert sched.last_epoch == steps_taken
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]


@pytest.mark.parametrize("scheduler_step", ["batch", "epoch"])
def test_chapter_4_one_cycle_claims_hold_per_batch_and_fail_per_epoch(scheduler_step: str) -> None:
    """04_cnn_training.ipynb, section 5 claims that after 2 of 5 epochs AdamW's beta1 is between 0.85 and 0.9, and
    that the run ends below a learning rate of 1e-6: true for OneCycleLR stepped after every batch, false when it is
    stepped once per epoch with total_steps counted in batches (the usual mistake). 225 batches per epoch, as the
    notebook's 7,200 images in batches of 32 (the last lr, one step past the schedule's end, depends on that)."""
    batches, model = 225, nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=5 * batches)
    beta1_after_2 = None
    for epoch in range(1, 6):
        for _ in range(batches):
            opt.step()                                   # no gradients: only the schedule matters here
            if scheduler_step == "batch":
                sched.step()
        if scheduler_step == "epoch":
            sched.step()
        if epoch == 2:
            beta1_after_2 = opt.param_groups[0]["betas"][0]
    claims = 0.85 < beta1_after_2 < 0.9 and sched.get_last_lr()[0] < 1e-6
    assert claims == (scheduler_step == "batch")


@pytest.mark.parametrize("cycle_momentum", [True, False])
def test_chapter_4_momentum_cycle_claims_hold_only_when_one_cycle_moves_the_momentum(cycle_momentum: bool) -> None:
    """04_cnn_training.ipynb, section 8: SGD's momentum starts at 0.95, is lowest (0.85) after 29 steps where the
    learning rate peaks, and 0.95 again for the 100th step. The cell's own probe, run as stored; with
    cycle_momentum=False the momentum stays 0.9 and each claim fails on its own (the second is also run without
    the first)."""
    import nbformat

    from ptlab.claims import ClaimFailed, claim

    nb = nbformat.read(Path(__file__).resolve().parents[2] / "notebooks" / "04_cnn_training.ipynb", as_version=4)
    cell = next(c.source for c in nb.cells if c.cell_type == "code" and "momenta, rates = " in c.source)
    probe = cell[cell.index("probe_sgd = "):cell.index("budget = ")]
    first = next(line for line in probe.splitlines() if line.startswith('claim("OneCycleLR replaced'))
    if cycle_momentum:
        exec(probe, {"torch": torch, "SmallCNN": SmallCNN, "claim": claim})
        return
    flat = probe.replace("total_steps=100)", "total_steps=100, cycle_momentum=False)")
    for variant in (flat, flat.replace(first, "")):
        namespace = {"torch": torch, "SmallCNN": SmallCNN, "claim": claim}
        with pytest.raises(ClaimFailed):
            exec(variant, namespace)
    assert set(namespace["momenta"]) == {0.9}                  # the second variant ran the whole schedule
