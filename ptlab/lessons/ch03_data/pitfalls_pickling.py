"""Chapter 3 pitfall: a lambda or a closure handed to workers that are started with spawn or forkserver."""
from __future__ import annotations

import functools
import time
import traceback
import warnings
from typing import Any, Callable

from torch.utils.data import DataLoader

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.lessons.ch03_data.datasets import VariableLengthSequences
from ptlab.workers import pad_collate

TORCH_PICKLE_WARNING = "Got pickle error when attempting to start a worker Process."


def padding_collate(padding_value: float) -> Callable[[list], Any]:
    """A collate_fn factory as it is often written: the closure it returns pads with padding_value, and because it
    is defined inside this function, pickle refuses it although this is a module."""

    def collate(batch: list) -> Any:
        return pad_collate(batch, padding_value=padding_value)

    return collate


def raised_while_pickling(err: BaseException) -> bool:
    """Whether err was raised in this process by multiprocessing pickling a new process's arguments."""
    return any(frame.name == "dump" and frame.filename.replace("\\", "/").endswith("multiprocessing/reduction.py")
               for frame in traceback.extract_tb(err.__traceback__))


@pitfall(
    id="lambda-collate-under-spawn", chapter=3,
    title="A lambda as collate_fn cannot be sent to workers started with spawn or forkserver",
    symptom="iterating the loader raises a pickling error in the main process while the first worker is being "
            "started (before any worker runs), torch warns 'Got pickle error when attempting to start a worker "
            "Process', and no batch arrives",
    why="""Under spawn (the default on macOS and Windows) and forkserver (on Linux from Python 3.14) the DataLoader
    pickles what each worker runs with: the dataset, the collate_fn, the worker_init_fn. pickle stores a function
    as its module and name, for the worker to import again. A lambda has no name there, and a function defined
    inside another function (a closure, the usual way to give a collate_fn a setting) has a name that exists only
    inside that call, so pickle refuses both, even when they were written in a module. It fails in the main
    process, while the first worker is being started. Under fork nothing is pickled, because the worker is a copy
    of the main process: the same loader works on Linux up to Python 3.13.""",
    catch="""Give workers functions defined at the top level of a module; to fix an argument, use
    functools.partial(module_function, name=value), which pickles as a reference to the function and its
    arguments. Test once with multiprocessing_context="spawn", or call pickle.dumps on the collate_fn.""",
)
def lambda_collate_under_spawn(buggy: bool) -> Outcome:
    collate = functools.partial(pad_collate, padding_value=-1)               # FIX: pickled by module and name
    if buggy:
        collate = lambda batch: pad_collate(batch, padding_value=-1)         # BUG: pickle refuses a lambda
    loader = DataLoader(VariableLengthSequences(n=8), batch_size=4, num_workers=1, collate_fn=collate,
                        multiprocessing_context="spawn")                     # macOS's and Windows' default
    batches, error, start = [], None, time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            batches = [padded.tolist() for padded, lengths, labels in loader]
        except Exception as err:                                             # the type differs between Pythons
            error = err
    seconds = time.perf_counter() - start
    warned = sum(TORCH_PICKLE_WARNING in str(w.message) for w in caught)
    pickling = error is not None and raised_while_pickling(error)
    return Outcome(
        figures={"batches delivered (of 2)": len(batches), "pickling error raised in this process": pickling,
                 "torch's pickle warnings": warned,
                 "seconds until the error or the last batch": seconds},
        checks=[Check("batches delivered (of 2)", len(batches), "== 0"),
                Check("a pickling error raised in this process", pickling, "is True"),
                Check(f"warnings '{TORCH_PICKLE_WARNING}'", warned, ">= 1")],
    )
