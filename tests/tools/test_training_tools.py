"""Chapter 4 tools: fit continuing a history, predictions, confusion matrix, plots, overfit_one_batch, exercises."""
from __future__ import annotations

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
    grid = plot_misclassified(images, [3, 5], torch.zeros(6, dtype=torch.long), torch.ones(6, dtype=torch.long), ["a", "b"])
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
    elif case == "lr":                     # BatchNorm keeps it finite: the loss rises instead of reaching NaN
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


