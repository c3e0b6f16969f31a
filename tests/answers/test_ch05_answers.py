"""Chapter 5 exercises: the stub, typical wrong answers with their hints, and a right answer."""
from torch import nn

from ptlab.course.exercises import check


def test_strip_prefix(capsys):
    assert check("ch5-strip-module-prefix", ...) == "not attempted"
    assert check("ch5-strip-module-prefix", lambda s: {k.replace("module.", ""): v for k, v in s.items()}) == "wrong"
    assert "expected" in capsys.readouterr().out
    assert check("ch5-strip-module-prefix",
                 lambda s: {k[len("module."):] if k.startswith("module.") else k: v for k, v in s.items()}) == "correct"


def _no_scaling(model, optimizer, micro_batches):
    optimizer.zero_grad()
    for X, y in micro_batches:
        nn.functional.cross_entropy(model(X), y).backward()
    optimizer.step()


def _right(model, optimizer, micro_batches):
    optimizer.zero_grad()
    for X, y in micro_batches:
        (nn.functional.cross_entropy(model(X), y) / len(micro_batches)).backward()
    optimizer.step()


def _stale(model, optimizer, micro_batches):
    for X, y in micro_batches:
        (nn.functional.cross_entropy(model(X), y) / len(micro_batches)).backward()
    optimizer.step()


def test_accumulate_gradients(capsys):
    def stub(model, optimizer, micro_batches):
        return ...

    assert check("ch5-accumulate-gradients", stub) == "not attempted"
    assert check("ch5-accumulate-gradients", _no_scaling) == "wrong"
    assert "about K = 4 times" in capsys.readouterr().out
    assert check("ch5-accumulate-gradients", _stale) == "wrong"
    out = capsys.readouterr().out
    assert "stale gradient" in out and "about K = 4 times" not in out
    assert check("ch5-accumulate-gradients", _right) == "correct"
