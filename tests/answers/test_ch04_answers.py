"""Chapter 4 exercises: right answers accepted, typical wrong ones rejected with a hint, the untouched cells not
attempted."""
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from ptlab import check
from ptlab.lessons.ch04_cnn_training.exercises import (_run, _same_code, _tiny_problem, mystery_setup,
                                                      untouched_train_steps)
from ptlab.models import SmallCNN
from ptlab.overfit import OverfitFailed, overfit_one_batch

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "04_cnn_training.ipynb"


def train_steps(model, optimizer, batches, zero_grad=True, softmax=False):
    """The right loop (train mode, logits into the loss, zero_grad/backward/step, mean of loss.item()), or it
    with one typical mistake."""
    model.train()
    total = 0.0
    for X, y in batches:
        out = model(X)
        loss = nn.functional.cross_entropy(out.softmax(dim=1) if softmax else out, y)
        if zero_grad:
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / len(batches)


def measure_accuracy(model, batches):
    was_training = model.training
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(X).argmax(1) == y).sum()) for X, y in batches)
    model.train(was_training)
    return correct / sum(len(y) for _, y in batches)


def _weights_after(loop) -> dict[str, list[float]]:
    model = _run(loop)[1]
    return {name: p.detach().flatten().tolist() for name, p in model.named_parameters()}


def _accuracy_figures():
    model, batches = _tiny_problem(seed=2)
    return {"accuracy": measure_accuracy(model.train(), batches)}


FIGURES = {   # how each stored figure is made (tests/answers/test_stored_figures.py)
    "ch4-fix-training-loop": lambda: {
        "mean loss": _run(train_steps)[0], "weights": _weights_after(train_steps),
        "weights without zero_grad": _weights_after(lambda m, o, b: train_steps(m, o, b, zero_grad=False)),
        "weights with softmax into cross_entropy": _weights_after(lambda m, o, b: train_steps(m, o, b, softmax=True))},
    "ch4-evaluate-without-side-effects": _accuracy_figures,
}


def test_chapter_4_exercises_accept_right_and_reject_wrong_answers(capsys) -> None:
    assert check("ch4-fix-training-loop", train_steps) == "correct"
    assert check("ch4-fix-training-loop", lambda m, o, b: train_steps(m, o, b, zero_grad=False)) == "wrong"
    assert "sum of every gradient" in capsys.readouterr().out
    assert check("ch4-fix-training-loop", lambda m, o, b: train_steps(m, o, b, softmax=True)) == "wrong"
    assert "cross_entropy had been given" in capsys.readouterr().out
    assert check("ch4-evaluate-without-side-effects", measure_accuracy) == "correct"

    def no_eval(model, batches):
        with torch.no_grad():
            return sum(int((model(X).argmax(1) == y).sum()) for X, y in batches) / 64

    assert check("ch4-evaluate-without-side-effects", no_eval) == "wrong"
    assert "ran in train mode" in capsys.readouterr().out
    model, batch = mystery_setup()
    with pytest.raises(OverfitFailed) as failure:
        overfit_one_batch(model, batch)
    assert list(failure.value.report.causes) == ["frozen parameters"]
    assert check("ch4-overfit-cause", lambda m: m.requires_grad_(True)) == "correct"
    assert check("ch4-overfit-cause", lambda m: m) == "wrong"                       # still frozen
    assert "frozen parameters" in capsys.readouterr().out
    assert check("ch4-overfit-cause", lambda m: SmallCNN(width=8)) == "wrong"       # a new model is not a repair
    def reset_linear(m):
        return m.apply(lambda mod: mod.reset_parameters() if isinstance(mod, nn.Linear) else None).requires_grad_(True)

    assert check("ch4-overfit-cause", reset_linear) == "wrong"
    assert "weights changed" in capsys.readouterr().out


def test_an_evaluation_that_always_ends_in_train_mode_is_wrong(capsys) -> None:
    def ends_in_train_mode(model, batches):
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(X).argmax(1) == y).sum()) for X, y in batches)
        model.train()
        return correct / sum(len(y) for _, y in batches)

    assert check("ch4-evaluate-without-side-effects", ends_in_train_mode) == "wrong"
    assert "left it in train mode" in capsys.readouterr().out


def test_the_loop_as_handed_out_is_not_attempted_and_is_the_notebooks_cell(capsys) -> None:
    assert check("ch4-fix-training-loop", untouched_train_steps) == "not attempted"
    cells = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]]
    cell = next(c for c in cells if 'check("ch4-fix-training-loop"' in c)
    namespace = {"nn": nn, "check": lambda *args: None}
    exec(cell, namespace)
    assert _same_code(namespace["train_steps"], untouched_train_steps)
