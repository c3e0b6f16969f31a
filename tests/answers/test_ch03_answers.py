"""Chapter 3 exercises: right answers accepted, wrong ones rejected (an unseeded worker too), stubs not attempted."""
import numpy as np
import torch
from torch.utils.data import get_worker_info

from ptlab import check
from ptlab.course.exercises import answer_digest
from ptlab.lessons.ch03_data.exercises import LABEL_CASES, _folder_labels, _start_method_for, check_worker_seeding
from ptlab.workers import seed_worker_numpy_rng


def test_the_seeding_exercise_runs_a_module_function_under_the_default_start_method():
    assert _start_method_for(reseed_from_torch) is None
    check_worker_seeding(reseed_from_torch)   # raises Wrong if the draws repeat


def calls_the_chapters_fix(worker_id):
    seed_worker_numpy_rng(worker_id)


def test_worker_seeding_refuses_the_chapters_own_fix(capsys):
    """The numpy-rng-in-init widget shows seed_worker_numpy_rng: handing it in, or a call to it, is not an answer."""
    import functools

    for answer in (seed_worker_numpy_rng, calls_the_chapters_fix, functools.partial(seed_worker_numpy_rng)):
        assert check("ch3-worker-seeding", answer) == "wrong"
        assert "seed_worker_numpy_rng" in capsys.readouterr().out


def reseed_from_the_os(worker_id):
    """Distinct in every worker and epoch, but never repeatable: OS entropy."""
    get_worker_info().dataset.rng = np.random.default_rng()


def reseed_from_torch(worker_id):
    get_worker_info().dataset.rng = np.random.default_rng(torch.initial_seed())


def not_reseeded(worker_id):
    pass


def stub(worker_id):
    ...


def test_worker_seeding_accepts_seeds_from_the_loader_and_rejects_os_entropy(capsys):
    assert check("ch3-worker-seeding", reseed_from_torch) == "correct"
    assert check("ch3-worker-seeding", reseed_from_the_os) == "wrong"
    assert "same generator seed" in capsys.readouterr().out
    assert check("ch3-worker-seeding", not_reseeded) == "not attempted"   # a body of `pass` is the stub too
    assert check("ch3-worker-seeding", stub) == "not attempted"


def label_lookup(class_to_idx, classes):
    return [classes.index(name) for name in sorted(class_to_idx, key=class_to_idx.get)]


BATCH_COUNT = (16, 15)      # 1000 = 15 * 64 + 40: 16 batches, the last of 40; with drop_last, 15

FIGURES = {   # how each stored figure is made (tests/answers/test_stored_figures.py)
    "ch3-label-lookup": lambda: {"lookups": [label_lookup(_folder_labels(c), list(c)) for c in LABEL_CASES]},
    "ch3-batch-count": lambda: {"answer": answer_digest(BATCH_COUNT)},
}


def test_label_lookup_and_batch_count(capsys):
    def inverse(class_to_idx, classes):
        return [class_to_idx[name] for name in classes]

    assert check("ch3-label-lookup", label_lookup) == "correct"
    assert check("ch3-label-lookup", inverse) == "wrong"
    assert "inverse" in capsys.readouterr().out
    assert check("ch3-label-lookup", lambda class_to_idx, classes: ...) == "not attempted"
    assert check("ch3-batch-count", (16, 15)) == "correct"
    assert check("ch3-batch-count", [16.0, np.int64(15)]) == "correct"
    assert check("ch3-batch-count", (15, 16)) == "wrong"
    assert "swapped" in capsys.readouterr().out
    assert check("ch3-batch-count", (16, 16)) == "wrong"
    assert check("ch3-batch-count", ("16", "15")) == "wrong"
    assert check("ch3-batch-count", ...) == "not attempted"
    hints = capsys.readouterr().out
    assert "15 * 64" not in hints and "= 15" not in hints     # the hint leads to the count, it does not do it
