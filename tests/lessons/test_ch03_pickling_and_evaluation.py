"""Chapter 3: what pickle does with a collate_fn under spawn, and shuffled evaluation matched back by position."""
import functools
import json
import pickle
import sys
import types

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from notebook_rules import ROOT
from ptlab.claims import ClaimFailed, claim
from ptlab.lessons.ch03_data.datasets import VariableLengthSequences
from ptlab.lessons.ch03_data.evaluation import lookup_predictor, score_in_loader_order
from ptlab.lessons.ch03_data.pitfalls_pickling import padding_collate, raised_while_pickling
from ptlab.workers import pad_collate


def test_pad_collate_pads_with_the_value_given():
    dataset = VariableLengthSequences(n=4, min_len=2, max_len=5, seed=0)
    padded, lengths, _ = pad_collate([dataset[i] for i in range(4)], padding_value=-1)
    assert all((row[n:] == -1).all() and (row[:n] != -1).all() for row, n in zip(padded, lengths))
    assert torch.equal(padding_collate(-1)([dataset[i] for i in range(4)])[0], padded)


def test_a_closure_from_a_module_is_refused_and_a_partial_is_not():
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(padding_collate(-1))
    restored = pickle.loads(pickle.dumps(functools.partial(pad_collate, padding_value=-1)))
    assert restored.func is pad_collate and restored.keywords == {"padding_value": -1}


def _code_cell(notebook: str, marker: str) -> str:
    cells = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    (source,) = ["".join(c["source"]) for c in cells if c["cell_type"] == "code" and marker in "".join(c["source"])]
    return source


def test_the_partial_claim_of_chapter_3_fails_for_a_partial_without_its_argument(monkeypatch):
    """03_data.ipynb's cell of four collate_fn forms claims the partial is recorded with padding_value=-1. Run as
    stored (in a module standing in for the notebook's __main__), every claim holds; with the partial's argument
    left out or changed, that claim fails (the round-4 review: the old check passed a partial with padding_value=0)."""
    source = _code_cell("03_data.ipynb", "pickled = {}")
    fixed = "functools.partial(pad_collate, padding_value=-1)}"
    assert fixed in source
    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    main.__dict__.update(functools=functools, pickle=pickle, pad_collate=pad_collate,
                         padding_collate=padding_collate, claim=claim)
    exec(compile(source, "03_data.ipynb", "exec"), main.__dict__)
    for buggy in ("functools.partial(pad_collate)}", "functools.partial(pad_collate, padding_value=0)}"):
        with pytest.raises(ClaimFailed, match="padding_value=-1"):
            exec(compile(source.replace(fixed, buggy), "03_data.ipynb", "exec"), main.__dict__)


def test_a_lambda_fails_in_this_process_under_spawn_and_the_error_is_recognised():
    loader = DataLoader(VariableLengthSequences(n=8), batch_size=4, num_workers=1, multiprocessing_context="spawn",
                        collate_fn=lambda batch: pad_collate(batch, padding_value=-1))
    with pytest.warns(UserWarning, match="Got pickle error"):
        with pytest.raises((pickle.PicklingError, AttributeError)) as err:
            next(iter(loader))
    assert raised_while_pickling(err.value)
    try:
        pad_collate([])
    except ValueError as other:
        assert not raised_while_pickling(other)


def _sorted_by_class() -> TensorDataset:
    """200 distinct random 'images', 20 per class, stored class by class as ImageFolder lists them."""
    images = torch.randint(0, 256, (200, 3, 4, 4), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    return TensorDataset(images, torch.arange(10).repeat_interleave(20))


def test_shuffled_evaluation_mispairs_files_and_the_notebook_claim_fails_in_order():
    """03_data.ipynb, section 11 claims that shuffled, more than 100 of 200 files get another class's prediction: it
    holds for a shuffled loader and fails for one that keeps the files' order (0 mispaired); accuracy is the same."""
    dataset = _sorted_by_class()
    predict = lookup_predictor(dataset)
    in_order, shuffled = (score_in_loader_order(dataset, predict, shuffle) for shuffle in (False, True))
    assert in_order == (200, 0) and shuffled[0] == 200
    assert shuffled[1] > 100
