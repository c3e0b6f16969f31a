"""Exercise checks: stub, wrong and right answers for every registered exercise."""
import pytest
import torch

from ptlab.exercises import all_exercises, check


def test_every_exercise_says_not_attempted_on_the_stub(capsys):
    exercises = all_exercises()
    assert len(all_exercises(chapter=1)) >= 2
    for ex in exercises:
        assert check(ex.id, ...) == "not attempted"
        assert "not attempted yet" in capsys.readouterr().out


def test_stub_function_counts_as_not_attempted():
    def brighten(img, amount):
        return ...

    assert check("ch1-safe-brighten", brighten) == "not attempted"


def test_wrong_answers_get_hints(capsys):
    assert check("ch1-broadcast-shape", (8, 1, 3)) == "wrong"
    assert "Hint:" in capsys.readouterr().out
    assert check("ch1-safe-brighten", lambda img, amount: img + amount) == "wrong"
    assert "[[10, 110, 210, 4]]" in capsys.readouterr().out
    assert check("ch1-normalize-rows", lambda x: x / x.sum(dim=1)) == "wrong"


def test_an_answer_that_raises_or_returns_none_is_wrong(capsys):
    def broken(img, amount):
        raise ValueError("oops")

    assert check("ch1-safe-brighten", broken) == "wrong"
    assert "raised ValueError: oops" in capsys.readouterr().out

    def forgot_return(x):
        x / x.sum(dim=1, keepdim=True)

    assert check("ch1-normalize-rows", forgot_return) == "wrong"
    assert "return" in capsys.readouterr().out


def test_an_in_place_answer_is_caught():
    def in_place(img, amount):
        img += amount
        return img

    assert check("ch1-safe-brighten", in_place) == "wrong"


def test_right_answers_pass():
    assert check("ch1-broadcast-shape", (8, 4, 3)) == "correct"
    assert check("ch1-safe-brighten", lambda img, a: (img.int() + a).clamp(0, 255).to(torch.uint8)) == "correct"
    assert check("ch1-normalize-rows", lambda x: x / x.sum(dim=1, keepdim=True)) == "correct"


def test_unknown_exercise():
    with pytest.raises(KeyError, match="no exercise"):
        check("ch9-nothing", 1)
