"""Exercise checks: stub, wrong and right answers for every registered exercise of chapters 1 and 2."""
import re

import pytest
import torch
from torch import nn

from ptlab.course.exercises import all_exercises, check
from ptlab.course.exercises import answer_digest
from ptlab.lessons.ch02_autograd.exercises import _penalty_model, _clipping_problem


def test_every_exercise_says_not_attempted_on_the_stub(capsys):
    exercises = all_exercises()
    assert len(all_exercises(chapter=1)) >= 2
    for ex in exercises:
        assert check(ex.id, ...) == "not attempted"
        assert "not attempted yet" in capsys.readouterr().out


def test_stub_function_counts_as_not_attempted():
    def contrast(img, factor):
        return ...

    assert check("ch1-safe-contrast", contrast) == "not attempted"


def test_a_function_whose_body_is_only_ellipsis_or_pass_is_not_attempted(capsys):
    """An untouched stub returns None without doing anything: "not attempted", not "a return is missing"."""
    def standardize_rows(x):
        ...

    def weight_penalty(model):
        """To do."""

    def clipped_step(model, opt, X, y, max_norm):
        pass

    def soft_gate(logits):
        ...

    assert check("ch1-normalize-rows", standardize_rows) == "not attempted"
    assert check("ch2-penalty-in-graph", weight_penalty) == "not attempted"
    assert check("ch2-clipped-step", clipped_step) == "not attempted"
    assert check("ch2-why-no-training", ("gate", soft_gate)) == "not attempted"
    assert check("ch2-why-no-training", ("gate", ...)) == "not attempted"
    assert "return` missing" not in capsys.readouterr().out


def test_wrong_answers_get_hints(capsys):
    assert check("ch1-broadcast-shape", [(6, 1, 3), None, (7, 7)]) == "wrong"
    assert "Hint:" in capsys.readouterr().out
    assert check("ch1-broadcast-shape", [(6, 5, 3), (4, 3), (7, 7)]) == "wrong"
    assert "entry 2" in capsys.readouterr().out
    assert check("ch1-broadcast-shape", [(6, 5, 3), None, (7,)]) == "wrong"
    assert check("ch1-broadcast-shape", (6, 5, 3)) == "wrong"          # the old one-pair answer shape
    assert check("ch1-safe-contrast", lambda img, f: ((img - 128) * f + 128).to(torch.uint8)) == "wrong"
    assert "[[128, 72, 128, 16, 116]]" in capsys.readouterr().out        # uint8 wraps in the subtraction
    assert check("ch1-safe-contrast", lambda img, f: (img.float() - 128) * f + 128) == "wrong"
    assert check("ch1-normalize-rows", lambda x: (x - x.mean(dim=1)) / x.std(dim=1, unbiased=False)) == "wrong"
    capsys.readouterr()
    assert check("ch1-normalize-rows",                                   # std's default divisor, n - 1
                 lambda x: (x - x.mean(dim=1, keepdim=True)) / x.std(dim=1, keepdim=True)) == "wrong"
    assert "dividing by n - 1" in capsys.readouterr().out


def test_an_answer_that_raises_or_returns_none_is_wrong(capsys):
    def broken(img, factor):
        raise ValueError("oops")

    assert check("ch1-safe-contrast", broken) == "wrong"
    assert "raised ValueError: oops" in capsys.readouterr().out

    def forgot_return(x):
        x - x.mean(dim=1, keepdim=True)

    assert check("ch1-normalize-rows", forgot_return) == "wrong"
    assert "return" in capsys.readouterr().out


def test_an_in_place_answer_is_caught(capsys):
    def overwrites(img, factor):
        img[:] = ((img.float() - 128) * factor + 128).clamp(0, 255).to(torch.uint8)
        return img

    assert check("ch1-safe-contrast", overwrites) == "wrong"
    assert "changed its input in place" in capsys.readouterr().out


def test_right_answers_pass():
    assert check("ch1-broadcast-shape", [(6, 5, 3), None, (7, 7)]) == "correct"
    assert check("ch1-safe-contrast",
                 lambda img, f: ((img.float() - 128) * f + 128).clamp(0, 255).to(torch.uint8)) == "correct"
    assert check("ch1-normalize-rows",
                 lambda x: (x - x.mean(dim=1, keepdim=True)) / x.std(dim=1, keepdim=True, unbiased=False)) == "correct"


def _good_step(model, opt, X, y, max_norm):
    opt.zero_grad()
    nn.functional.mse_loss(model(X), y).backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    return norm


def weight_penalty(model):
    return sum(p.pow(2).sum() for p in model.parameters())


def _clipping_figures():
    model, opt, X, y = _clipping_problem()
    norms, weights = [], []
    for _ in range(3):
        norms.append(_good_step(model, opt, X, y, 1.0).item())
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
    return {"norms before clipping": norms, "weights after each step": weights}


FIGURES = {   # how each stored figure is made (tests/answers/test_stored_figures.py)
    "ch2-why-no-training": lambda: {"layer": answer_digest("gate")},
    "ch2-penalty-in-graph": lambda: {"penalty": weight_penalty(_penalty_model()).item()},
    "ch2-clipped-step": _clipping_figures,
}


def test_chapter_2_answers(capsys):
    assert check("ch2-why-no-training", ("gate", torch.sigmoid)) == "correct"
    assert check("ch2-why-no-training", ("gate", lambda logits: (logits.clamp(-1, 1) + 1) / 2)) == "correct"
    assert check("ch2-why-no-training", ("gate", "non-differentiable")) == "wrong"     # the old answer's shape
    assert check("ch2-why-no-training", ("features", torch.sigmoid)) == "wrong"
    assert check("ch2-why-no-training", ("head", torch.sigmoid)) == "wrong"
    capsys.readouterr()
    wrong_gates = {"the hard gate itself": lambda logits: (logits > 0).float(),
                   "a leaf that asks for grad": lambda logits: (logits > 0).float().requires_grad_(),
                   "a detached sigmoid": lambda logits: torch.sigmoid(logits).detach(),
                   "a zero gradient": lambda logits: (logits > 0).float() + 0 * logits,
                   "not between 0 and 1": torch.relu,
                   "between -1 and 1": torch.tanh,
                   "open at the wrong end": lambda logits: torch.sigmoid(-logits)}
    for name, gate in wrong_gates.items():
        assert check("ch2-why-no-training", ("gate", gate)) == "wrong", name
    out = capsys.readouterr().out
    assert "no gradient reaches the logits" in out and "0 everywhere" in out and "from 0 (shut) to 1 (open)" in out
    assert check("ch2-penalty-in-graph", weight_penalty) == "correct"
    capsys.readouterr()
    assert check("ch2-penalty-in-graph", lambda m: torch.tensor(1.0)) == "wrong"
    out = capsys.readouterr().out
    assert "the value is 1.0000, expected" in out
    assert not re.search(r"\d\.\d{5,}", out), out                       # no 16-digit figures beside 4
    assert check("ch2-clipped-step", lambda *a: _good_step(*a).item()) == "correct"
    assert check("ch2-clipped-step", _good_step) == "wrong"             # a tensor where the task says a float
    assert "Python float" in capsys.readouterr().out


def test_clipped_step_mistakes_get_their_hints(capsys):
    def no_zero_grad(model, opt, X, y, max_norm):
        nn.functional.mse_loss(model(X), y).backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        return norm.item()

    def clip_after_step(model, opt, X, y, max_norm):
        opt.zero_grad()
        nn.functional.mse_loss(model(X), y).backward()
        opt.step()
        return nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()

    def norm_after_clipping(model, opt, X, y, max_norm):
        _good_step(model, opt, X, y, max_norm)
        return min(max_norm, torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())

    assert check("ch2-clipped-step", no_zero_grad) == "wrong"
    assert "do gradients pile up" in capsys.readouterr().out
    assert check("ch2-clipped-step", clip_after_step) == "wrong"
    assert "clip after backward() and before opt.step()" in capsys.readouterr().out
    assert check("ch2-clipped-step", norm_after_clipping) == "wrong"
    assert "you returned the norm after clipping" in capsys.readouterr().out


def test_no_hint_contains_an_answer():
    """Hints lead to the idea; none holds the code or the value that solves its exercise."""
    answers = {"ch1-broadcast-shape": ["(6, 5, 3)", "(7, 7)"], "ch1-safe-contrast": ["clamp(0, 255)", ".float()"],
               "ch1-normalize-rows": ["keepdim=True"],
               "ch2-why-no-training": [r"\bgate\b", "non-differentiable", "sigmoid", "clamp"],
               "ch2-penalty-in-graph": ["pow(2)", "p.pow", "** 2"], "ch2-clipped-step": ["clip_grad_norm_", ".item()"],
               "ch4-overfit-cause": ["requires_grad", "first key", "causes is a dict"]}
    for ex in all_exercises():
        for answer in answers.get(ex.id, []):
            found = re.search(answer, ex.hint) if answer.startswith(r"\b") else answer in ex.hint
            assert not found, (ex.id, answer)


def test_chapter_1_widget_texts_hold_no_exercise_answer():
    from ptlab.course.pitfalls import all_pitfalls

    for record in all_pitfalls(chapter=1):
        text = record.why + record.catch
        assert "keepdim=True" not in text and "clamp(0, 255)" not in text, record.id


def test_unknown_exercise():
    with pytest.raises(KeyError, match="no exercise"):
        check("ch9-nothing", 1)


def test_penalty_feedback_names_each_mistake_and_gives_its_hint(capsys):
    """Exercise 2.2, the wrong answers of the first-day walkthrough (learner-ch1-ch2-ch4.md) and two more."""
    def new_leaf(model):                      # the value rebuilt as a new leaf: no parameter in its graph
        return torch.tensor(sum(p.pow(2).sum().item() for p in model.parameters()), requires_grad=True)

    def weights_only(model):                  # in the graph, but the biases are left out
        return sum(p.pow(2).sum() for name, p in model.named_parameters() if "weight" in name)

    def new_leaf_times_two(model):            # a graph that starts from a new leaf
        return 2 * torch.tensor(sum(p.pow(2).sum().item() for p in model.parameters()) / 2, requires_grad=True)

    def half_detached(model):                 # the right value, half of each square cut from the graph
        return sum((p * p.detach()).sum() for p in model.parameters())

    assert check("ch2-penalty-in-graph", new_leaf) == "wrong"
    out = capsys.readouterr().out
    assert "no parameter gets a gradient from your penalty: it is a new leaf" in out
    assert "Hint: requires_grad=True on a tensor made from numbers starts a new graph" in out
    assert "biases" not in out and "a Python number" not in out
    assert check("ch2-penalty-in-graph", weights_only) == "wrong"
    out = capsys.readouterr().out
    assert "0.bias, 1.bias get no gradient from your penalty: it leaves them out." in out
    assert "Hint: model.parameters() gives every tensor the optimizer trains, the biases included" in out
    assert "Python number" not in out and "the value is" not in out
    assert check("ch2-penalty-in-graph", new_leaf_times_two) == "wrong"
    assert "its graph starts from a new leaf" in capsys.readouterr().out
    assert check("ch2-penalty-in-graph", half_detached) == "wrong"
    out = capsys.readouterr().out
    assert "the value is right, but the gradient of sum(w^2) with respect to each parameter w is 2w" in out
    assert check("ch2-penalty-in-graph", lambda m: sum(p.pow(2).sum().item() for p in m.parameters())) == "wrong"
    assert "return a tensor, not float: a Python number has no graph." in capsys.readouterr().out


def test_penalty_with_biases_as_numbers_or_detached_is_not_told_it_leaves_them_out(capsys):
    """Exercise 2.2: the biases' squares in the value as numbers or detached: the value is right, the graph is not."""
    def biases_as_numbers(model):
        return sum(p.pow(2).sum() if "weight" in n else p.pow(2).sum().item() for n, p in model.named_parameters())

    def biases_detached(model):
        return sum(p.pow(2).sum() if "weight" in n else p.detach().pow(2).sum() for n, p in model.named_parameters())

    def one_bias_as_float(model):
        return sum(p.pow(2).sum() if n != "1.bias" else float(p.pow(2).sum()) for n, p in model.named_parameters())

    for answer in (biases_as_numbers, biases_detached):
        assert check("ch2-penalty-in-graph", answer) == "wrong"
        out = capsys.readouterr().out
        assert "0.bias, 1.bias get no gradient from your penalty: their squares are in its value, but as " \
               "numbers or detached, so not in the graph." in out
        assert "Hint: a Python number (from .item(), float() or torch.tensor(...)) carries no graph" in out
        assert "leaves them out" not in out and "the biases included" not in out
    assert check("ch2-penalty-in-graph", one_bias_as_float) == "wrong"
    out = capsys.readouterr().out
    assert "1.bias gets no gradient from your penalty: its square is in its value, but as a number or detached" in out
    assert "leaves" not in out
