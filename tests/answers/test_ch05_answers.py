"""Chapter 5 exercises: the stub, typical wrong answers with their hints, and a right answer."""
import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from ptlab.course.exercises import check


def test_strip_prefix(capsys):
    assert check("ch5-strip-module-prefix", ...) == "not attempted"

    def stub(state):
        return ...   # your code here

    assert check("ch5-strip-module-prefix", stub) == "not attempted"
    assert check("ch5-strip-module-prefix", lambda s: {k.replace("module.", ""): v for k, v in s.items()}) == "wrong"
    assert "expected" in capsys.readouterr().out
    assert check("ch5-strip-module-prefix",
                 lambda s: {k[len("module."):] if k.startswith("module.") else k: v for k, v in s.items()}) == "correct"


def test_strip_prefix_in_place_is_told_to_return_the_dict(capsys):
    assert check("ch5-strip-module-prefix", lambda s: consume_prefix_in_state_dict_if_present(s, "module.")) == "wrong"
    out = capsys.readouterr().out
    assert "in place" in out and "return the dict" in out and "is a `return` missing" not in out


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


def _zero_inside(model, optimizer, micro_batches):
    for X, y in micro_batches:
        optimizer.zero_grad()
        (nn.functional.cross_entropy(model(X), y) / len(micro_batches)).backward()
    optimizer.step()


def _step_inside(model, optimizer, micro_batches):
    optimizer.zero_grad()
    for X, y in micro_batches:
        (nn.functional.cross_entropy(model(X), y) / len(micro_batches)).backward()
        optimizer.step()


def _sum_loss(model, optimizer, micro_batches):
    optimizer.zero_grad()
    for X, y in micro_batches:
        nn.functional.cross_entropy(model(X), y, reduction="sum").backward()
    optimizer.step()


def test_accumulate_gradients_stubs_are_not_attempted(capsys):
    def stub(model, optimizer, micro_batches):
        ...   # your code here

    def stub_with_return(model, optimizer, micro_batches):
        return ...

    assert check("ch5-accumulate-gradients", stub) == "not attempted"
    assert check("ch5-accumulate-gradients", stub_with_return) == "not attempted"
    out = capsys.readouterr().out
    assert "✘" not in out and "Hint" not in out


def test_accumulate_gradients_names_each_mistake(capsys):
    for answer, words in ((_no_scaling, "divide each micro-batch's loss by K"),
                          (_stale, "left over from earlier work"),
                          (_zero_inside, "only the last micro-batch's gradient"),
                          (_step_inside, "K optimizer steps"),
                          (_sum_loss, "compare your loop with the hint")):
        assert check("ch5-accumulate-gradients", answer) == "wrong"
        out = capsys.readouterr().out
        assert words in out, (answer.__name__, out)
    assert check("ch5-accumulate-gradients", _right) == "correct"


def _concatenated(model, optimizer, micro_batches):
    optimizer.zero_grad()
    X, y = torch.cat([X for X, _ in micro_batches]), torch.cat([y for _, y in micro_batches])
    nn.functional.cross_entropy(model(X), y).backward()
    optimizer.step()


def _one_graph(model, optimizer, micro_batches):
    optimizer.zero_grad()
    sum(nn.functional.cross_entropy(model(X), y) / len(micro_batches) for X, y in micro_batches).backward()
    optimizer.step()


def _pairs_concatenated(model, optimizer, micro_batches):
    """Two micro-batches merged at a time: half the batch's activations alive, not the whole."""
    optimizer.zero_grad()
    for i in range(0, len(micro_batches), 2):
        X = torch.cat([X for X, _ in micro_batches[i:i + 2]])
        y = torch.cat([y for _, y in micro_batches[i:i + 2]])
        (nn.functional.cross_entropy(model(X), y) * len(X) / sum(len(x) for x, _ in micro_batches)).backward()
    optimizer.step()


def _pairs_in_one_graph(model, optimizer, micro_batches):
    optimizer.zero_grad()
    for i in range(0, len(micro_batches), 2):
        sum(nn.functional.cross_entropy(model(X), y) / len(micro_batches) for X, y in micro_batches[i:i + 2]).backward()
    optimizer.step()


def test_accumulate_gradients_refuses_answers_that_save_no_memory(capsys):
    """Round 3: each gives the right step and keeps more than one micro-batch's activations alive; round 4: the
    message says how many, not 'the whole batch', when only part of it was merged."""
    for answer, words in ((_concatenated, "model(X) ran on 32 of the batch's 32 rows at once: 4 micro-batches'"),
                          (_one_graph, "4 forward passes (of 4) ran before a backward"),
                          (_pairs_concatenated, "model(X) ran on 16 of the batch's 32 rows at once: 2 micro-batches'"),
                          (_pairs_in_one_graph, "2 forward passes (of 4) ran before a backward")):
        assert check("ch5-accumulate-gradients", answer) == "wrong"
        out = capsys.readouterr().out
        assert words in out, (answer.__name__, out)
