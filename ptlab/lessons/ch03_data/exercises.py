"""Chapter 3 exercises: label order, worker seeding, batch counts."""
from __future__ import annotations

from typing import Any, Callable

from ptlab.course.exercises import NotAttempted, Wrong, answer_digest, calls_stub, exercise, is_untouched_stub
from ptlab.lessons.ch03_data.datasets import AugmentWithNumpyRng
from ptlab.workers import seed_worker_numpy_rng
from ptlab.lessons.ch03_data.exercise_figures import FIGURES

# The class lists (in the learner's weights' order) the label lookup is checked on; the lookups it expects are
# stored figures.
LABEL_CASES = (("arrow_up", "arrow_down", "circle", "ring"), ("cat", "ant", "bee"))


def _folder_labels(intended) -> dict[str, int]:
    """The class_to_idx ImageFolder makes for these classes: sorted by name."""
    return {name: i for i, name in enumerate(sorted(intended))}


@exercise(
    id="ch3-label-lookup", chapter=3,
    task="write label_lookup(class_to_idx, classes) returning a list where lookup[folder_label] is the "
         "index of the same class in the list `classes` (the class names in your weights' order)",
    hint="work from one folder label at a time: which class name did ImageFolder give that label, and where "
         "does that name sit in your own list?",
)
def check_label_lookup(label_lookup: Callable[[dict[str, int], list[str]], Any]) -> None:
    for classes, expected in zip(LABEL_CASES, FIGURES["ch3-label-lookup"]["lookups"], strict=True):
        intended = list(classes)
        class_to_idx = _folder_labels(intended)
        lookup = calls_stub(label_lookup, dict(class_to_idx), list(intended))
        try:
            lookup = [int(v) for v in lookup]
        except (TypeError, ValueError):
            raise Wrong(f"return a list of ints, got {type(lookup).__name__}.") from None
        if lookup == expected:
            continue
        if lookup == [class_to_idx[name] for name in intended]:
            raise Wrong("that is the inverse mapping: index the result by the folder's label, not yours.")
        if lookup != expected:
            raise Wrong(f"for intended={intended} you gave {lookup}; ImageFolder label 0 is "
                        f"{sorted(intended)[0]!r}, which is {expected[0]} in yours.")


def _is_the_chapters_fix(fn: Callable) -> bool:
    """True for ptlab.workers.seed_worker_numpy_rng itself, a partial of it, a copy of its code or a call to it."""
    fn = getattr(fn, "func", fn)                                  # functools.partial(...) wraps it
    code = getattr(fn, "__code__", None)
    return fn is seed_worker_numpy_rng or code is not None and (
        code.co_code == seed_worker_numpy_rng.__code__.co_code or seed_worker_numpy_rng.__name__ in code.co_names)


def _start_method_for(fn: Callable) -> str | None:
    """The platform's default start method, except for a function defined in a notebook (module __main__).

    spawn and forkserver workers import a worker_init_fn by module and name, which a notebook's __main__ cannot
    provide; fork copies it with the process. So a notebook's function runs under fork where the OS has it
    (Linux, macOS); on Windows, which has no fork, the learner is told to move it into a module.
    """
    import multiprocessing

    if getattr(fn, "__module__", None) != "__main__":
        return None
    if "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    raise Wrong("this system has no fork start method, so workers cannot import a function defined in the "
                "notebook: put reseed_in_worker in a .py file next to the notebook, import it, and check that.")


@exercise(
    id="ch3-worker-seeding", chapter=3,
    task="write a worker_init_fn that reseeds the dataset's numpy Generator (dataset.rng) so 2 workers over "
         "2 epochs draw 16 distinct augmentations from AugmentWithNumpyRng(8), and the same 16 again when the "
         "run is repeated with the same generator seed",
    hint="a worker_init_fn runs inside each worker, where torch.utils.data.get_worker_info() describes that "
         "worker: its own copy of the dataset, and a seed that differs per worker and at each start of the "
         "workers (every epoch, unless persistent_workers=True) and follows the DataLoader's generator. Reseed from "
         "that seed, never from the clock or the OS, so a rerun repeats",
)
def check_worker_seeding(init_fn: Callable[[int], None]) -> None:
    import torch
    from torch.utils.data import DataLoader


    if not callable(init_fn):
        raise Wrong(f"expected a function, got {type(init_fn).__name__}")
    if is_untouched_stub(init_fn):
        raise NotAttempted
    if _is_the_chapters_fix(init_fn):
        raise Wrong("that is ptlab.workers.seed_worker_numpy_rng, the fix the chapter's pitfall shows: write your "
                    "own worker_init_fn, in your own words.")
    context = _start_method_for(init_fn)

    def two_epochs(seed: int) -> list[int]:
        loader = DataLoader(AugmentWithNumpyRng(n=8), batch_size=2, num_workers=2, worker_init_fn=init_fn,
                            multiprocessing_context=context, generator=torch.Generator().manual_seed(seed))
        return [v for _ in range(2) for batch in loader for v in batch.tolist()]

    try:
        draws, again = two_epochs(0), two_epochs(0)
    except Exception as err:
        last = str(err).strip().splitlines()[-1]
        raise Wrong(f"the DataLoader raised: {last}") from None
    if len(set(draws)) < len(draws):
        raise Wrong(f"{len(set(draws))} distinct draws out of {len(draws)}: some worker or epoch still repeats.")
    if draws != again:
        raise Wrong("the draws are distinct, but a second run with the same generator seed drew other values: "
                    "your seed does not come from the DataLoader, so no run can be repeated.")


@exercise(
    id="ch3-batch-count", chapter=3,
    task="how many batches does a DataLoader over 1000 samples with batch_size=64 yield, with drop_last=False "
         "and with drop_last=True? Answer as a tuple (without_drop, with_drop)",
    hint="count the full batches of 64 that fit in 1000 samples, then ask what happens to the samples left over "
         "with each setting of drop_last",
)
def check_batch_count(answer: Any) -> None:
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise Wrong("answer with a tuple of two ints, such as (10, 9).")
    given = _whole_numbers(answer)
    if answer_digest(given[::-1]) == FIGURES["ch3-batch-count"]["answer"]:
        raise Wrong("the two are swapped: drop_last removes a batch.")
    if answer_digest(given) != FIGURES["ch3-batch-count"]["answer"]:
        raise Wrong(f"{tuple(answer)} is not it.")


def _whole_numbers(answer) -> tuple:
    """The answer as a tuple of ints where each entry equals one (16.0 or numpy's 16 count as 16)."""
    try:
        ints = tuple(int(v) for v in answer)
    except (TypeError, ValueError):
        return tuple(answer)
    return ints if all(i == v for i, v in zip(ints, answer)) else tuple(answer)
