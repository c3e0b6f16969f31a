"""Chapter 4 tools: fit continuing a history, predictions, confusion matrix, plots, overfit_one_batch, exercises."""
from __future__ import annotations

import math

import matplotlib
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ptlab.data import normalize_uint8, uint8_split
from ptlab.overfit import OverfitFailed, OverfitReport, overfit_one_batch
from ptlab.results import confusion_matrix, per_class_accuracy, plot_confusion_matrix, plot_misclassified, predict
from ptlab.train import History, fit


def blobs(n: int = 300, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three separable Gaussian blobs in 2-D."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    centres = torch.tensor([[0.0, 3.0], [3.0, -2.0], [-3.0, -2.0]])
    return torch.randn(n, 2, generator=g) * 0.5 + centres[y], y


def loaders() -> tuple[DataLoader, DataLoader]:
    X, y = blobs()
    train = DataLoader(TensorDataset(X[:200], y[:200]), batch_size=20, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(X[200:], y[200:]), batch_size=50)


def test_fit_continues_a_history_like_one_long_run() -> None:
    train, test = loaders()

    def run(splits: list[int]) -> tuple[History, nn.Module]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        train.generator.manual_seed(0)
        history = None
        for epochs in splits:
            history = fit(model, train, test, opt, epochs=epochs, progress=False, history=history)
        return history, model

    whole, model_a = run([4])
    parts, model_b = run([1, 2, 1])
    assert parts.epoch == [1, 2, 3, 4] and len(parts.seconds) == 4
    assert parts.val_acc == whole.val_acc and parts.train_loss == whole.train_loss
    assert all(torch.equal(p, q) for p, q in zip(model_a.parameters(), model_b.parameters()))
    with pytest.raises(TypeError, match="history must be"):
        fit(model_a, train, test, torch.optim.SGD(model_a.parameters(), lr=0.1), epochs=1, progress=False,
            history={"epoch": []})


def test_predict_and_confusion_matrix_agree_with_evaluate() -> None:
    from ptlab.train import evaluate

    train, test = loaders()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    fit(model, train, test, torch.optim.SGD(model.parameters(), lr=0.1), epochs=2, progress=False)
    model.train()
    predicted, targets = predict(model, test)
    assert model.training, "predict must restore the model's mode"
    matrix = confusion_matrix(predicted, targets, num_classes=3)
    assert int(matrix.sum()) == 100
    assert matrix.diag().sum().item() / 100 == evaluate(model, test)["acc"]
    assert torch.equal(matrix.sum(dim=1), torch.bincount(targets, minlength=3))


def test_confusion_matrix_layout_and_errors() -> None:
    matrix = confusion_matrix(torch.tensor([0, 1, 1, 2]), torch.tensor([0, 0, 1, 2]), num_classes=3)
    assert matrix.tolist() == [[1, 1, 0], [0, 1, 0], [0, 0, 1]]          # row = true, column = predicted
    assert per_class_accuracy(matrix).tolist() == [0.5, 1.0, 1.0]
    with pytest.raises(ValueError, match="outside"):
        confusion_matrix(torch.tensor([3]), torch.tensor([0]), num_classes=3)
    with pytest.raises(ValueError, match="same shape"):
        confusion_matrix(torch.tensor([0, 1]), torch.tensor([0]), num_classes=3)


def test_plots_return_figures_and_leave_nothing_open() -> None:
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    matrix = confusion_matrix(torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1]), num_classes=2)
    fig = plot_confusion_matrix(matrix, ["a", "b"])
    assert isinstance(fig, matplotlib.figure.Figure)
    images = {3: torch.zeros(3, 8, 8, dtype=torch.uint8), 5: torch.rand(3, 8, 8)}
    grid = plot_misclassified(images, [3, 5], torch.zeros(6, dtype=torch.long), torch.ones(6, dtype=torch.long),
                              ["a", "b"])
    assert isinstance(grid, matplotlib.figure.Figure)
    assert plt.get_fignums() == before
    with pytest.raises(ValueError, match="class names"):
        plot_confusion_matrix(matrix, ["a", "b", "c"])
    with pytest.raises(TypeError, match=r"\(C, H, W\)"):
        plot_misclassified({0: torch.zeros(8, 8)}, [0], torch.zeros(1), torch.zeros(1), ["a"])


def test_overfit_one_batch_passes_and_leaves_the_model_alone() -> None:
    X, y = blobs(30)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 3))
    before = [p.clone() for p in model.parameters()]
    report = overfit_one_batch(model, (X, y), steps=300)
    assert isinstance(report, OverfitReport) and report.passed and report.losses[-1] <= 0.05
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("case, expected", [
    ("frozen", "frozen parameters"),
    ("detached", "detached graph"),
    ("lr", "learning rate too high"),
    ("same input", "labels do not match inputs"),
])
def test_overfit_one_batch_names_the_cause(case: str, expected: str) -> None:
    X, y = blobs(30)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 3))
    kwargs = {}
    if case == "frozen":
        model.requires_grad_(False)
    elif case == "detached":
        class Cut(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Linear(2, 32), nn.Linear(32, 3)

            def forward(self, x):
                return self.b(torch.relu(self.a(x))).detach()   # the whole output cut from the graph
        model = Cut()
    elif case == "lr":                     # Adam moves a weight by about lr per step: the loss rises, finite
        from ptlab.models import SmallCNN
        model, kwargs = SmallCNN(width=4), {"lr": 1e3}
        X = torch.randn(30, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    elif case == "same input":
        X = X[:1].expand(30, -1)
    with pytest.raises(OverfitFailed) as failure:
        overfit_one_batch(model, (X, y), steps=100, **kwargs)
    assert expected in failure.value.report.causes, failure.value.report.causes
    assert expected in str(failure.value)
    report = overfit_one_batch(model, (X, y), steps=5, raise_on_failure=False, **kwargs)
    assert not report.passed


def test_overfit_one_batch_rejects_bad_input() -> None:
    model = nn.Linear(2, 3)
    with pytest.raises(TypeError, match=r"\(inputs, targets\)"):
        overfit_one_batch(model, torch.zeros(4, 2))
    with pytest.raises(ValueError, match="steps"):
        overfit_one_batch(model, (torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)), steps=0)
    with pytest.raises(TypeError, match="model must be"):
        overfit_one_batch("model", (torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)))


def test_normalize_uint8_gives_about_zero_mean_unit_std_and_rejects_floats() -> None:
    images, _ = uint8_split(True)
    x = normalize_uint8(images[:64])
    assert x.dtype == torch.float32 and x.shape == (64, 3, 32, 32)
    assert abs(x.mean().item()) < 0.2 and abs(x.std().item() - 1) < 0.2
    with pytest.raises(ValueError, match="uint8"):
        normalize_uint8(x)




def test_label_smoothing_floor_is_the_entropy_of_the_smoothed_target_and_torchs_minimum() -> None:
    from ptlab.overfit import label_smoothing_floor

    floor = label_smoothing_floor(10, 0.1)
    assert floor == pytest.approx(-(0.91 * math.log(0.91) + 9 * 0.01 * math.log(0.01)))
    assert 0.50 < floor < 0.501
    best = torch.tensor([[0.91] + [0.01] * 9]).log()
    assert nn.functional.cross_entropy(best, torch.tensor([0]),
                                       label_smoothing=0.1).item() == pytest.approx(floor, rel=1e-5)
    assert label_smoothing_floor(10, 0.0) == 0.0 and label_smoothing_floor(4, 1.0) == pytest.approx(math.log(4))
    with pytest.raises(ValueError, match="smoothing"):
        label_smoothing_floor(10, 1.5)
    with pytest.raises(ValueError, match="num_classes"):
        label_smoothing_floor(1, 0.1)


@pytest.mark.parametrize("kwargs, targets", [
    ({"label_smoothing": 0.2}, "indices"),
    ({"label_smoothing": 0.2, "weight": torch.tensor([0.5, 1.0, 2.0])}, "indices"),
    ({"label_smoothing": 0.2, "reduction": "sum"}, "indices"),
    ({"label_smoothing": 0.3, "ignore_index": 1}, "indices"),
    ({"label_smoothing": 0.2}, "probabilities"),
    ({"label_smoothing": 0.2, "weight": torch.tensor([0.5, 1.0, 2.0])}, "probabilities"),
])
def test_the_floor_of_a_smoothed_cross_entropy_is_its_minimum(kwargs: dict, targets: str) -> None:
    """The floor overfit_one_batch aims at equals what a direct minimisation over the logits reaches."""
    from ptlab.overfit import _smoothing_floor

    X, y = blobs(12)
    if targets == "probabilities":
        y = torch.softmax(torch.randn(12, 3, generator=torch.Generator().manual_seed(1)), dim=1)
    loss_fn = nn.CrossEntropyLoss(**kwargs)
    floor, reason = _smoothing_floor(loss_fn, torch.zeros(12, 3), y)
    assert reason == f"label_smoothing={kwargs['label_smoothing']:g} over 3 classes"
    logits = torch.zeros(12, 3, requires_grad=True)
    opt = torch.optim.LBFGS([logits], max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = loss_fn(logits, y)
        loss.backward()
        return loss

    opt.step(closure)
    assert loss_fn(logits, y).item() == pytest.approx(floor, rel=1e-4)
    assert _smoothing_floor(nn.CrossEntropyLoss(), torch.zeros(12, 3), y) == (0.0, "")


def test_overfit_one_batch_aims_at_the_label_smoothing_floor_and_says_so() -> None:
    from ptlab.overfit import label_smoothing_floor

    X, y = blobs(30)

    def run(**kwargs) -> OverfitReport:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 3))
        return overfit_one_batch(model, (X, y), steps=150, raise_on_failure=False, **kwargs)

    floor = label_smoothing_floor(3, 0.1)
    smoothed = run(loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1))
    assert smoothed.passed and smoothed.loss_floor == pytest.approx(floor, rel=1e-5)
    assert smoothed.target_loss == pytest.approx(floor + 0.05, rel=1e-5) and min(smoothed.losses) > floor
    assert "the loss floor" in str(smoothed) and "label_smoothing=0.1 over 3 classes" in str(smoothed)
    hidden = lambda logits, t: nn.functional.cross_entropy(logits, t, label_smoothing=0.1)  # noqa: E731
    blind = run(loss_fn=hidden)                      # a functional loss: the floor cannot be read from it
    assert not blind.passed and blind.loss_floor == 0.0 and "the loss floor" not in str(blind)
    given = run(loss_fn=hidden, loss_floor=floor)
    assert given.passed and "given as loss_floor" in str(given)
    plain = run()
    assert plain.loss_floor == 0.0 and plain.target_loss == 0.05 and "(reached 0.05)" in str(plain)
    with pytest.raises(ValueError, match="loss_floor"):
        run(loss_floor=float("nan"))


def test_the_diagonal_claim_of_chapter_4_fails_for_predictions_made_in_train_mode() -> None:
    """04_cnn_training.ipynb, section 6 claims that the confusion matrix's diagonal gives evaluate()'s accuracy: it
    checks that predict() runs the model as evaluate() does. Predictions made in train mode (BatchNorm normalising
    with each batch's statistics) break it."""
    from torch.utils.data import DataLoader, TensorDataset

    from ptlab.train import evaluate

    X = torch.randn(200, 2, generator=torch.Generator().manual_seed(0)) + torch.tensor([10.0, 0.0])   # (200, 2)
    y = (X[:, 1] > 0).long()
    model = nn.BatchNorm1d(2)            # running statistics still mean 0, var 1: eval mode sees feature 0 near 10
    loader = DataLoader(TensorDataset(X, y), batch_size=50)
    accuracy = evaluate(model, loader)["acc"]
    as_evaluate = confusion_matrix(*predict(model, loader), num_classes=2)
    assert as_evaluate.diag().sum().item() / 200 == accuracy                      # the notebook's claim holds
    model.train()
    with torch.no_grad():
        in_train_mode = torch.cat([model(Xb).argmax(dim=1) for Xb, _ in loader])  # (200,): the bug
    buggy = confusion_matrix(in_train_mode, y, num_classes=2)
    assert abs(buggy.diag().sum().item() / 200 - accuracy) > 0.1                  # ...and would fail
