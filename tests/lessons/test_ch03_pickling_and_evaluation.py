"""Chapter 3: what pickle does with a collate_fn under spawn, and shuffled evaluation matched back by position."""
import functools
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

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
