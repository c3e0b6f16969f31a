"""Chapter 3 pitfalls: Dataset, DataLoader, workers, files and label order."""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.data import CLASSES, export_image_folder, load_arrays, to_nchw
from ptlab.lessons.ch03_data.datasets import (
    AugmentWithNumpyRng,
    ChunkedValues,
    DummyOnUnreadable,
    NumberStream,
    ShardedNumberStream,
    SquaresDataset,
    corrupt_files,
)
from ptlab.lessons.ch03_data.processes import child_pids, private_mib
from ptlab.workers import (
    NoneOnUnreadable,
    image_folder_skipping_unreadable,
    relabel_image_folder,
    seed_worker_numpy_rng,
    skip_none_collate,
)

_SPAWN_TIMEOUT_S = 120


def _pil_to_uint8():
    from torchvision.transforms import v2

    return v2.PILToTensor()  # PIL image -> uint8 (3, H, W), no scaling


def _nearest_neighbour_on_train():
    """A stand-in for correctly trained weights: 1-NN on the train split, 100% right on its images."""

    images, labels = load_arrays(train=True)                                    # (N, 32, 32, 3), (N,)
    memory = to_nchw(images).flatten(1).float()                                 # (N, 3072)
    targets = torch.from_numpy(labels.copy())

    def predict(batch: torch.Tensor) -> torch.Tensor:                           # (B, 3, 32, 32) uint8
        return targets[torch.cdist(batch.flatten(1).float(), memory).argmin(dim=1)]

    return predict


@pitfall(
    id="imagefolder-class-order", chapter=3,
    title="ImageFolder numbers classes in sorted order, not in your label order",
    symptom="a model that is right on every image gets fewer than half of 200 images right (chance is 1 in 10): "
            "labels were permuted, not images; the table counts the classes that keep their intended index",
    why="""ImageFolder sorts the folder names with Python's sorted() (by code point: '10' before '2', 'Zebra'
    before 'apple') and numbers them 0, 1, 2... The weights were trained with the
    project's own order (arrow_up=0, arrow_down=1, ...), where only 'circle' happens to get the same
    index. Nothing raises: the tensors have the right shapes and dtypes, only the meaning of each label changed.""",
    catch="""Pin the mapping: keep the intended class list in one place, relabel the ImageFolder with it (or
    override find_classes), and assert dataset.class_to_idx == intended before training or evaluating.""",
)
def imagefolder_class_order(buggy: bool) -> Outcome:
    from torchvision.datasets import ImageFolder


    intended = {name: i for i, name in enumerate(CLASSES)}                  # the order the weights were trained with
    predict = _nearest_neighbour_on_train()                                  # 100% right under `intended`
    with tempfile.TemporaryDirectory() as tmp:
        root = export_image_folder(Path(tmp) / "train", train=True, per_class=20)  # root/<class>/<i>.png
        folder = ImageFolder(str(root), transform=_pil_to_uint8())           # BUG: class_to_idx in sorted order
        if not buggy:
            folder = relabel_image_folder(folder, intended)                  # FIX: the project's own order
        images, labels = next(iter(DataLoader(folder, batch_size=len(folder))))  # (200, 3, 32, 32), (200,)
    right = int((predict(images) == labels).sum())                           # an exact count, not a measurement
    same_index = sum(folder.class_to_idx[name] == i for name, i in intended.items())  # printed: fixed by the names
    return Outcome(
        figures={"images right (of 200)": right, "classes with the intended index": f"{same_index} of {len(intended)}",
                 "class_to_idx['arrow_up']": folder.class_to_idx["arrow_up"]},
        checks=[Check("images right (of 200), by a model right on every image", right, "< 100")],
    )


def _image_tree_with_unreadable_files(root: Path, bad: int = 3) -> list[str]:
    """Export 8 images per class and truncate `bad` of them; return the truncated ones relative to root."""

    export_image_folder(root, train=True, per_class=8)
    files = sorted(root.rglob("*.png"))
    truncated = files[5::len(files) // bad][:bad]
    corrupt_files(truncated)
    return [str(p.relative_to(root)) for p in truncated]


def _tiny_classifier() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


@pitfall(
    id="corrupt-file-dummy-label", chapter=3,
    title="A dummy sample with label -1 for an unreadable file crashes the loss",
    symptom="IndexError: Target -1 is out of bounds, raised by the loss mid-epoch before all 77 good samples were "
            "trained on",
    why="""A common tip is to catch the decode error in __getitem__ and return a blank image with label -1.
    CrossEntropyLoss only skips targets equal to ignore_index, which defaults to -100, so -1 is an
    out-of-range class and the loss raises, at a random step, in whichever batch the bad file lands in.
    Setting ignore_index=-1 stops the crash, and the dummy then contributes nothing to the loss or its gradient;
    but it still takes a slot in its batch, the files stay unreported, and a model with BatchNorm mixes the blank
    image into its batch statistics.""",
    catch="""Check the files once when you index them (PIL's Image.open(...).load()) and drop the unreadable
    ones, keeping their names in a list you print; or return None and drop None in a collate_fn. Count
    what was skipped so a silently shrinking dataset is visible.""",
)
def corrupt_file_dummy_label(buggy: bool) -> Outcome:
    from torchvision.datasets import ImageFolder

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "train"
        truncated = _image_tree_with_unreadable_files(root)                  # 80 files, 3 unreadable
        if buggy:
            dataset = DummyOnUnreadable(ImageFolder(str(root), _pil_to_uint8()))  # BUG: bad file -> (zeros, -1)
        else:
            dataset = image_folder_skipping_unreadable(root, _pil_to_uint8())  # FIX: dropped at index time, listed
        model, opt = _tiny_classifier()
        loader = DataLoader(dataset, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
        trained_on, error = 0, "-"
        try:
            for images, labels in loader:
                loss = nn.functional.cross_entropy(model(images.float() / 255), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                trained_on += len(labels)
        except IndexError as err:
            error = f"IndexError: {err}"
    skipped = getattr(dataset, "skipped", [])
    return Outcome(
        figures={"error": error, "samples trained on": trained_on, "unreadable files": len(truncated),
                 "files reported as skipped": len(skipped)},
        checks=[Check("error raised by the loss", error, "contains 'Target -1 is out of bounds'"),
                Check("samples trained on (77 are readable)", trained_on, "< 77")],
    )


@pitfall(
    id="corrupt-file-drops-batch", chapter=3,
    title="Catching a bad file around the whole batch throws away the good samples with it",
    symptom="3 unreadable files out of 80 cost more than 10 of the 77 good samples in one epoch",
    why="""Wrapping next(loader) in try/except and skipping on error looks safe, but the exception is raised
    while the loader fetches the batch's samples (before they are collated), and next() then returns no batch at
    all, so every good sample in it is discarded too. Which ones are lost changes
    with the shuffle order, so the loss curve only gets a little noisier.""",
    catch="""Handle the error per sample: return None from __getitem__ for an unreadable file and drop None in
    a collate_fn (or drop the file at index time). Count samples seen per epoch and compare with len(dataset).""",
)
def corrupt_file_drops_batch(buggy: bool) -> Outcome:
    from torchvision.datasets import ImageFolder

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "train"
        truncated = _image_tree_with_unreadable_files(root)                  # 80 files, 3 unreadable
        dataset, collate = ImageFolder(str(root), _pil_to_uint8()), None  # an unreadable file raises OSError
        if not buggy:
            dataset = NoneOnUnreadable(dataset)                              # FIX: unreadable -> None
            collate = skip_none_collate                                      # FIX: None dropped per sample
        loader = DataLoader(dataset, batch_size=16, shuffle=True, collate_fn=collate,
                            generator=torch.Generator().manual_seed(0))
        batches, seen = iter(loader), 0
        while True:
            try:
                images, labels = next(batches)
            except StopIteration:
                break
            except OSError:
                continue                                                     # BUG: skips the whole batch
            seen += len(labels)
    good = len(dataset) - len(truncated)
    return Outcome(
        figures={"good samples": good, "samples seen": seen, "good samples lost": good - seen,
                 "unreadable files": len(truncated)},
        checks=[Check("good samples lost in one epoch", good - seen, "> 10")],
    )


@pitfall(
    id="numpy-rng-in-init", chapter=3,
    title="A numpy Generator made in Dataset.__init__ repeats in every worker and every epoch",
    symptom="16 random augmentations over 2 workers and 2 epochs hold at most 8 distinct values, and epoch 2 "
            "repeats epoch 1",
    why="""Each worker gets a copy of the dataset, Generator included, in the very same state. torch seeds its
    own RNG, Python's random and numpy's global np.random in every worker it starts (every epoch, unless
    persistent_workers=True), but it cannot know about a Generator stored on your dataset. Non-persistent workers
    are re-created from the untouched original each epoch, so epoch 2 replays epoch 1.""",
    catch="""Draw augmentation randomness from torch (torch.randint, torchvision transforms) or reseed your
    Generator in a worker_init_fn from torch.utils.data.get_worker_info().seed. Test it: collect the random
    parameters of one epoch with num_workers=2 and assert they are distinct.""",
)
def numpy_rng_in_init(buggy: bool) -> Outcome:
    dataset = AugmentWithNumpyRng(n=8)                                       # self.rng = default_rng(0) in __init__
    init_fn = None                                                           # BUG: workers copy one Generator state
    if not buggy:
        init_fn = seed_worker_numpy_rng                                      # FIX: reseed from get_worker_info().seed
    loader = DataLoader(dataset, batch_size=2, num_workers=2, worker_init_fn=init_fn,  # any start method
                        generator=torch.Generator().manual_seed(0))
    epochs = [[v for batch in loader for v in batch.tolist()] for _ in range(2)]  # 2 epochs x 8 draws
    draws = epochs[0] + epochs[1]
    return Outcome(
        figures={"draws": len(draws), "distinct draws": len(set(draws)),
                 "epoch 2 repeats epoch 1": epochs[0] == epochs[1]},
        checks=[Check("distinct draws (of 16)", len(set(draws)), "<= 8"),
                Check("epoch 2 repeats epoch 1", epochs[0] == epochs[1], "is True")],
    )


def _no_fork() -> str | None:
    """Why the fork pitfall cannot run here (Windows has no fork), or None."""
    import multiprocessing

    if "fork" in multiprocessing.get_all_start_methods():
        return None
    return "this platform has no fork (Windows), and this pitfall measures fork's copy-on-write sharing"


@pitfall(
    id="python-objects-per-worker", chapter=3,
    title="A Dataset of millions of Python objects is copied into every forked worker",
    symptom="each of 2 forked workers holds over 30 MiB of private memory after one epoch over a list of 4M "
            "floats (the same values as a numpy array are 30.5 MiB)",
    why="""fork shares the parent's memory copy-on-write. Reading a Python object still writes to it: its
    reference count changes, so the page holding it is copied into the worker. Touch every float of a list
    once and every worker owns a full private copy of those pages. A numpy array is one object whose data
    buffer is only read, so its pages stay shared.""",
    catch="""Under fork, store big datasets as numpy arrays or tensors, not lists of Python objects (lists of
    paths or dicts count too). Under spawn or forkserver (macOS, Windows, Linux from Python 3.14) every worker
    unpickles its own copy of whatever the dataset holds, arrays included: there keep big data in a file that
    each worker memory-maps (np.load(path, mmap_mode="r")) or opens itself. Measure:
    psutil.Process(pid).memory_full_info().uss of each worker after an epoch.""",
    unavailable=_no_fork,
)
def python_objects_per_worker(buggy: bool) -> Outcome:
    values = np.random.default_rng(0).random(4_000_000)                      # (4M,) float64, 30.5 MiB
    if buggy:
        values = values.tolist()                                             # BUG: 4M Python floats, each refcounted
    # FIX: keep the numpy array: one object whose buffer is only read
    dataset = ChunkedValues(values, chunk=20_000)                            # 200 samples of 20k values
    loader = DataLoader(dataset, batch_size=10, num_workers=2, persistent_workers=True,
                        multiprocessing_context="fork")                      # fork: copy-on-write sharing
    already_running = child_pids()
    epoch = iter(loader)                                                     # starts the 2 workers
    workers = child_pids(exclude=already_running)
    total = sum(batch.sum().item() for batch in epoch)                       # every worker touches its samples
    private = [private_mib(pid) for pid in workers]                          # still alive: persistent_workers
    del epoch, loader
    leanest = min(private)
    return Outcome(
        figures={"workers": len(private), "private MiB, leanest worker": leanest, "sum of the data": total},
        checks=[Check("private MiB of the leanest worker after one epoch", leanest, "> 30")],
    )


_SPAWN_SCRIPT = '''
import torch
from torch.utils.data import DataLoader, Dataset
{dataset}
loader = DataLoader(Squares(8), batch_size=4, num_workers=1, multiprocessing_context="spawn")
print("batches:", [batch.tolist() for batch in loader])
'''
_IN_MAIN = '''
class Squares(Dataset):                      # defined in __main__, like a notebook cell
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
    def __getitem__(self, i): return i * i
'''


@pitfall(
    id="spawn-notebook-dataset", chapter=3,
    title="Workers started with spawn cannot find a Dataset class defined in a notebook",
    symptom="the worker fails with AttributeError: Can't get attribute 'Squares' on <module '__main__'>, "
            "and the script exits with an error",
    why="""spawn (the default on macOS and Windows) starts each worker as a fresh Python process and sends it
    the dataset pickled, which records only the class's module and name. A notebook's classes live in
    __main__, which the worker cannot import, so unpickling fails. fork (the Linux default up to Python 3.13;
    3.14 defaults to forkserver) copies the parent process instead, which is why the same notebook works there.""",
    catch="""Define Dataset classes, collate functions and worker_init_fn in a .py module and import them.
    To test for it on Linux, pass multiprocessing_context="spawn" to the DataLoader once in your test suite.""",
    in_subprocesses=True,                 # a fresh Python each way: compare_pitfall runs both at once
)
def spawn_notebook_dataset(buggy: bool) -> Outcome:
    if buggy:
        dataset = _IN_MAIN                                                   # BUG: the class lives in __main__
    else:
        dataset = f"from {SquaresDataset.__module__} import SquaresDataset as Squares"  # FIX: from a module
    code = _SPAWN_SCRIPT.format(dataset=textwrap.dedent(dataset))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,  # -c: no file, like a notebook
                         timeout=_SPAWN_TIMEOUT_S)
    errors = re.findall(r"^(\w+Error: .*)$", run.stderr, flags=re.MULTILINE)   # the exception lines of stderr
    worker_error = next((e for e in errors if e.startswith("AttributeError")), errors[-1] if errors else "-")
    worker_error = re.sub(r"<module '__main__' \(.*\)>", "<module '__main__'>", worker_error)  # 3.12+: (<class ...>)
    return Outcome(
        figures={"exit code": run.returncode, "worker error": worker_error, "output": run.stdout.strip() or "-"},
        checks=[Check("worker error", worker_error, "contains 'AttributeError'"),
                Check("worker error names the class", worker_error, "contains 'Squares'"),
                Check("exit code", run.returncode, "!= 0")],
    )


@pitfall(
    id="shuffle-off-for-training", chapter=3,
    title="shuffle=False on a training set stored class by class",
    symptom="more than half of the 20 batches hold a single class, and after one epoch accuracy is below 50% "
            "(chance is 10%)",
    why="""Datasets are often stored grouped by class (ImageFolder lists class folders in order). Without
    shuffling, each batch is one class and the optimiser chases the class of the moment, undoing what it
    learned from the earlier ones; the epoch ends with weights fitted to the last few classes. The opposite
    mistake exists too: shuffle=True on an evaluation loader whose predictions you later zip with file names or
    timestamps pairs most predictions with the wrong record (the notebook counts them).""",
    catch="""shuffle=True (or a shuffling sampler) for training, shuffle=False for evaluation. Log the number of
    distinct labels in the first few batches; one label per batch is the tell.""",
)
def shuffle_off_for_training(buggy: bool) -> Outcome:
    g = torch.Generator().manual_seed(0)
    centres = 2 * torch.randn(10, 20, generator=g)                            # 10 classes in 20-d
    labels = torch.arange(10).repeat_interleave(100)                         # (1000,) sorted: class 0 first
    X = centres[labels] + torch.randn(1000, 20, generator=g)                 # (1000, 20)
    dataset = torch.utils.data.TensorDataset(X, labels)
    loader = DataLoader(dataset, batch_size=50, shuffle=not buggy,          # BUG: shuffle=False for training
                        generator=torch.Generator().manual_seed(0))          # FIX: shuffle=True
    torch.manual_seed(0)
    model = nn.Linear(20, 10)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    per_batch, losses = [], []
    for xb, yb in loader:
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        per_batch.append(len(yb.unique()))
        losses.append(loss.item())
    with torch.no_grad():
        accuracy = (model(X).argmax(dim=1) == labels).float().mean().item()
    single = sum(n == 1 for n in per_batch)
    return Outcome(
        figures={"distinct labels per batch, mean": f"{sum(per_batch) / len(per_batch):g}",  # exact: a seeded shuffle
                 "batches holding a single label": single, "accuracy after 1 epoch": accuracy},
        series={"training loss": losses}, x_label="batch",
        checks=[Check("batches holding a single label (of 20)", single, "> 10"),
                Check("accuracy after 1 epoch", accuracy, "< 0.5")],
    )


@pitfall(
    id="iterable-dataset-duplicates", chapter=3,
    title="An IterableDataset with workers yields its whole stream once per worker",
    symptom="with num_workers=2, a stream of 40 samples gives 80 samples in one epoch: every sample twice, "
            "and nothing raises",
    why="""With a map-style Dataset the DataLoader's main process takes each batch of indices from the sampler
    and sends it to one worker in turn, so each index is loaded once. An IterableDataset has no indices to
    send; the DataLoader gives every worker its own copy and calls __iter__ in each,
    so each worker reads the stream from the start. An epoch is then num_workers times longer, and every
    sample is trained on num_workers times.""",
    catch="""Shard in __iter__ with torch.utils.data.get_worker_info(): worker info.id of info.num_workers takes
    its own share (every num_workers-th item, or its own files). Count the samples of one epoch with
    num_workers=2 and compare them with the stream's length.""",
)
def iterable_dataset_duplicates(buggy: bool) -> Outcome:
    stream = NumberStream(40)                                                # BUG: every worker yields 0 .. 39
    if not buggy:
        stream = ShardedNumberStream(40)                                     # FIX: worker w takes w, w + 2, ...
    loader = DataLoader(stream, batch_size=5, num_workers=2)                 # the platform's start method
    seen = [v for batch in loader for v in batch.tolist()]
    twice = sum(seen.count(v) == 2 for v in range(stream.n))
    return Outcome(
        figures={"stream length": stream.n, "samples in one epoch": len(seen), "distinct samples": len(set(seen)),
                 "stream samples seen twice": twice},
        checks=[Check("samples in one epoch (the stream holds 40)", len(seen), "== 80"),
                Check("stream samples seen exactly twice (of 40)", twice, "== 40")],
    )
