"""Chapter 4 exercises: right answers accepted, typical wrong ones rejected with a hint, the untouched cells not
attempted."""
import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from ptlab import check
from ptlab.lessons.ch04_cnn_training.exercises import (EVAL_BATCH_SIZES, _run, _same_code, _tiny_problem,
                                                      mystery_setup, untouched_train_steps)
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


def mean_of_batch_accuracies(model, batches):
    """A typical wrong answer: every batch's accuracy weighs the same, whatever its size."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        accuracies = [(model(X).argmax(1) == y).float().mean().item() for X, y in batches]
    model.train(was_training)
    return sum(accuracies) / len(accuracies)


def _accuracy_figures():
    model, batches = _tiny_problem(seed=2, sizes=EVAL_BATCH_SIZES)
    model.eval()
    with torch.no_grad():
        right = sum(int((model(X).argmax(1) == y).sum()) for X, y in batches)
    return {"accuracy": measure_accuracy(model.train(), batches), "right answers": right,
            "mean of per-batch accuracies": mean_of_batch_accuracies(model.train(), batches)}


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


# The wrong answers a learner writes (the round-3 walkthrough's among them), each with the words its verdict and its
# hint must hold: the mistake named, not another one.
def _loop(mode="train", softmax=False, zero_grad=True, total="item"):
    def steps(model, optimizer, batches):
        model.train(mode == "train")
        running = 0.0 if total == "item" else 0
        for X, y in batches:
            out = model(X)
            loss = nn.functional.cross_entropy(out.softmax(dim=1) if softmax else out, y)
            if zero_grad:
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running = running + (loss.item() if total == "item" else loss)
        return running / len(batches)
    return steps


LOOP_MISTAKES = {   # name: (answer, in the verdict, in the hint)
    "eval mode and a tensor total": (_loop(mode="eval", total="tensor"), "you return a tensor", "four things"),
    "eval mode, total fixed": (_loop(mode="eval"), "still behave as they do at evaluation", "four things"),
    "softmax into cross_entropy": (_loop(softmax=True), "cross_entropy had been given something other", "four"),
    "no zero_grad": (_loop(zero_grad=False), "sum of every gradient so far", "four things"),
}


@pytest.mark.parametrize("mistake", LOOP_MISTAKES)
def test_exercise_4_1_names_each_mistake(mistake, capsys) -> None:
    answer, verdict, hint = LOOP_MISTAKES[mistake]
    assert check("ch4-fix-training-loop", answer) == "wrong"
    said, told = capsys.readouterr().out.split(" Hint: ")
    assert verdict in said and hint in told, said + told


def _accuracy(mode="eval", grad=False, restore="was", per_batch=False, divide_by=None, as_tensor=False):
    def measure(model, batches):
        was_training = model.training
        model.train(mode == "train")
        with torch.set_grad_enabled(grad):
            hits = [(model(X).argmax(1) == y) for X, y in batches]
        model.train({"was": was_training, "train": True, "eval": False}[restore])
        if per_batch:
            return sum(h.float().mean().item() for h in hits) / len(hits)
        correct = sum(h.sum() for h in hits)
        if as_tensor:
            return correct / sum(len(y) for _, y in batches)
        return int(correct) / (divide_by(batches) if divide_by else sum(len(y) for _, y in batches))
    return measure


ACCURACY_MISTAKES = {   # name: (answer, in the verdict, in the hint)
    "mean of per-batch accuracies": (_accuracy(per_batch=True), "mean of the 4 batches' accuracies",
                                     "divide once by the number of examples"),
    "batches assumed equal": (_accuracy(divide_by=lambda b: len(b) * len(b[0][1])), "you divide by 4 x 16 = 64",
                              "a last batch is often smaller"),
    "no eval()": (_accuracy(mode="train"), "ran in train mode", "which mode the model is in"),
    "no no_grad()": (_accuracy(grad=True), "recorded an autograd graph", "no autograd graph"),
    "eval() left on": (_accuracy(restore="eval"), "restore its mode", "put back exactly that mode"),
    "train() at the end, whatever the mode was": (_accuracy(restore="train"), "left it in train mode",
                                                  "put back exactly that mode"),
    "a tensor returned": (_accuracy(as_tensor=True), "not a tensor", "leave no trace"),
}


@pytest.mark.parametrize("mistake", ACCURACY_MISTAKES)
def test_exercise_4_2_names_each_mistake(mistake, capsys) -> None:
    answer, verdict, hint = ACCURACY_MISTAKES[mistake]
    assert check("ch4-evaluate-without-side-effects", answer) == "wrong"
    said, told = capsys.readouterr().out.split(" Hint: ")
    assert verdict in said and hint in told, said + told


def test_exercise_4_2s_batches_tell_the_mean_of_batch_accuracies_from_the_accuracy() -> None:
    """Unequal batches: the per-batch mean, the count over 4 x 16 and the right accuracy are three numbers."""
    model, batches = _tiny_problem(seed=2, sizes=EVAL_BATCH_SIZES)
    right = measure_accuracy(model.train(), batches)
    wrong = {mean_of_batch_accuracies(model, batches), _accuracy(divide_by=lambda b: 64)(model, batches)}
    assert len({right, *wrong}) == 3 and min(abs(right - w) for w in wrong) > 0.01


def _unfreeze(prefix=""):
    def unblock(model):
        for name, p in model.named_parameters():
            if name.startswith(prefix):
                p.requires_grad = True
        return model
    return unblock


def _new_leaf_head(model):
    model.head.weight = nn.Parameter(model.head.weight.detach().clone())
    return model.requires_grad_(True)


UNBLOCK_MISTAKES = {   # name: (answer, in the verdict, in the hint)
    "the head alone unfrozen": (_unfreeze("head"), "still do not learn: features.4.0.weight", "every one of them"),
    "nothing changed": (lambda m: m, "likely causes now: frozen parameters", "read the likely causes"),
    "a new model": (lambda m: SmallCNN(width=8), "not a copy or a new one", "read the likely causes"),
    "a copy unfrozen": (lambda m: copy.deepcopy(m).requires_grad_(True), "not a copy or a new one", "likely causes"),
    "weights re-initialised": (lambda m: m.apply(lambda mod: mod.reset_parameters() if isinstance(mod, nn.Linear)
                                                 else None).requires_grad_(True), "weights changed", "likely causes"),
    "a parameter replaced": (_new_leaf_head, "you replaced parameters", "likely causes"),
    "nothing returned": (lambda m: m.requires_grad_(True) and None, "returned None", "likely causes"),
}


@pytest.mark.parametrize("mistake", UNBLOCK_MISTAKES)
def test_exercise_4_3_names_each_mistake(mistake, capsys) -> None:
    answer, verdict, hint = UNBLOCK_MISTAKES[mistake]
    assert check("ch4-overfit-cause", answer) == "wrong"
    said, told = capsys.readouterr().out.split(" Hint: ")
    assert verdict in said and hint in told, said + told


def test_exercise_4_3_accepts_every_parameter_unfrozen() -> None:
    assert check("ch4-overfit-cause", _unfreeze()) == "correct"
    assert check("ch4-overfit-cause", lambda m: m.requires_grad_(True)) == "correct"
