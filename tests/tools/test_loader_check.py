"""ptlab.loader_check: throughput, wait vs compute, verdicts, and clear errors on bad input."""
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from ptlab.lessons.ch03_data.datasets import CostlySamples, SampleRaisesAt
from ptlab.loader_check import LoaderCheckError, LoaderReport, check_loader, simulated_step


class FailsAt(Dataset):
    """Sample `bad` raises ValueError; the rest are their index."""

    def __init__(self, n=40, bad=13):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if index == self.bad:
            raise ValueError("pixel data is broken")
        return torch.tensor(index)


class Numbers(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(20))


def test_slow_samples_with_a_quick_step_are_input_bound():
    loader = DataLoader(CostlySamples(TensorDataset(torch.zeros(200, 3)), work=500), batch_size=10)
    report = check_loader(loader, compute=lambda batch: None, warmup_batches=2, max_batches=5)  # a free step
    assert isinstance(report, LoaderReport)
    assert report.batches == 5 and report.samples == 50
    assert report.verdict == "input-bound" and report.input_bound and "num_workers" in report.next_step
    assert report.wait_share > 0.9 and report.samples_per_s == pytest.approx(10 * report.batches_per_s)


def test_without_a_compute_step_there_is_no_verdict():
    # An in-memory TensorDataset, where workers only add overhead: without a step to compare with, the
    # loader alone always "waits" 100% of the time, which is no evidence for advising workers.
    loader = DataLoader(TensorDataset(torch.zeros(400, 3)), batch_size=10)
    report = check_loader(loader, max_batches=10)
    assert report.verdict == "unknown" and not report.input_bound
    assert "num_workers" not in report.next_step and "compute=" in report.next_step
    assert report.batches == 10 and report.samples_per_s > 0 and report.samples_per_s_by_workers == {}
    assert "verdict          unknown" in str(report)


@pytest.mark.parametrize("context", [None, "spawn"])
def test_without_a_compute_step_it_measures_the_loader_at_each_worker_count_asked(context):
    from ptlab.lessons.ch03_data.datasets import SquaresDataset

    # the rebuilt loaders keep the given start method where they have workers (spawn imports SquaresDataset)
    loader = DataLoader(SquaresDataset(64), batch_size=8, num_workers=1, multiprocessing_context=context)
    report = check_loader(loader, warmup_batches=1, max_batches=4, workers=(0, 1))
    rates = report.samples_per_s_by_workers
    assert set(rates) == {0, 1} and all(r > 0 for r in rates.values()) and report.verdict == "unknown"
    assert "loader alone, num_workers=0" in str(report) and "loader alone, num_workers=1" in str(report)
    with pytest.raises(ValueError, match="workers must be ints"):
        check_loader(loader, workers=(-1,))
    with pytest.raises(TypeError, match="DataLoader"):
        check_loader([torch.zeros(2)], workers=(0,))


def test_fast_samples_with_a_slow_step_are_compute_bound():
    loader = DataLoader(TensorDataset(torch.zeros(200, 3)), batch_size=10)
    report = check_loader(loader, compute=simulated_step(0.01), max_batches=5)
    assert report.verdict == "compute-bound" and report.compute_s >= 0.05 and report.wait_share < 0.3
    text = str(report)
    assert "samples/s" in text and "batches/s" in text and "compute-bound" in text and repr(report) == text


def test_input_bound_with_workers_on_every_core_suggests_cheaper_samples(monkeypatch):
    import ptlab.loader_check as lc

    monkeypatch.setattr(lc, "usable_cpus", lambda: 1)
    loader = DataLoader(CostlySamples(TensorDataset(torch.zeros(40, 3)), work=500), batch_size=4, num_workers=1)
    assert "cheaper" in check_loader(loader, compute=simulated_step(0), max_batches=4).next_step


@pytest.mark.parametrize("num_workers, context", [(0, None), (2, None), (2, "spawn")])
def test_a_failing_sample_is_named_with_its_original_error(num_workers, context):
    dataset = FailsAt() if context is None else SampleRaisesAt(40, bad_index=13)   # spawn imports it from a module
    loader = DataLoader(dataset, batch_size=4, num_workers=num_workers, shuffle=True, multiprocessing_context=context)
    with pytest.raises(LoaderCheckError) as caught:
        check_loader(loader, warmup_batches=0, max_batches=20)
    err = caught.value
    message = "pixel data is broken" if context is None else "cannot parse the label file"
    assert err.index == 13 and err.original_type == "ValueError" and err.original_message == message
    assert "sample 13" in str(err) and ("worker" in str(err)) == (num_workers > 0)


def test_other_iterables_are_measured_too():
    report = check_loader([torch.zeros(4, 2)] * 6, warmup_batches=1, max_batches=3)
    assert report.batches == 3 and report.samples == 12
    assert check_loader(DataLoader(Numbers(), batch_size=5), warmup_batches=0).samples == 20


@pytest.mark.parametrize("bad, error, words", [
    (42, TypeError, "loader must be an iterable"),
    ("batches", TypeError, "loader must be an iterable"),
    (DataLoader(TensorDataset(torch.zeros(0, 3))), ValueError, "dataset is empty"),
    (DataLoader(TensorDataset(torch.zeros(3, 3)), batch_size=4, drop_last=True), ValueError, "no batches"),
])
def test_bad_loaders_get_clear_errors(bad, error, words):
    with pytest.raises(error, match=words):
        check_loader(bad)


def test_bad_arguments_get_clear_errors():
    loader = DataLoader(TensorDataset(torch.zeros(8, 3)), batch_size=4)
    with pytest.raises(ValueError, match="warmup_batches"):
        check_loader(loader, warmup_batches=-1)
    with pytest.raises(ValueError, match="max_batches"):
        check_loader(loader, max_batches=0)
    with pytest.raises(TypeError, match="compute"):
        check_loader(loader, compute="fast")
    with pytest.raises(ValueError, match="lower warmup_batches"):
        check_loader(loader, warmup_batches=5)
    with pytest.raises(ValueError, match="seconds"):
        simulated_step(-1)


def test_throughput_by_workers_and_cpu_cost():
    from ptlab.loader_check import cpu_seconds_per_sample, throughput_by_workers

    dataset = CostlySamples(TensorDataset(torch.zeros(96, 3)), work=200)
    rates = throughput_by_workers(dataset, (0, 1), batch_size=8, max_batches=4, repeats=1)
    assert set(rates) == {0, 1} and all(r > 0 for r in rates.values())
    assert 0 < cpu_seconds_per_sample(dataset, samples=20) < 1
    with pytest.raises(ValueError, match="worker_counts"):
        throughput_by_workers(dataset, (-1,))
    with pytest.raises(ValueError, match="empty"):
        cpu_seconds_per_sample(TensorDataset(torch.zeros(0)))


def test_report_prints_every_machine_dependent_figure_as_measured():
    import re

    loader = DataLoader(TensorDataset(torch.zeros(60, 3)), batch_size=10)
    text = str(check_loader(loader, compute=simulated_step(0.001), warmup_batches=1, max_batches=4))
    masked = re.sub(r"≈-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[+-]?\d+)?|nan|inf) *", "",
                    text)   # as tests/nbval_sanitize.cfg
    header, *figures = masked.splitlines()
    assert header.startswith("loader check over 4 batches (40 samples)")
    assert not any(ch.isdigit() for line in figures[:4] for ch in line), figures[:4]


@pytest.mark.parametrize("context", [None, "spawn"])
def test_dataloader_reraises_the_original_error_and_check_loader_adds_the_index(context):
    def loader():
        return DataLoader(SampleRaisesAt(24, bad_index=17), batch_size=4, num_workers=2, shuffle=True,
                          generator=torch.Generator().manual_seed(0), multiprocessing_context=context)

    with pytest.raises(ValueError) as plain:
        list(loader())
    text = str(plain.value)
    assert "Caught ValueError in DataLoader worker process" in text and "Original Traceback" in text
    assert "cannot parse the label file" in text and "sample 17" not in text
    with pytest.raises(LoaderCheckError) as checked:
        check_loader(loader(), warmup_batches=0)
    assert checked.value.index == 17 and "sample 17" in str(checked.value)


def test_a_worker_init_fn_reaches_the_real_dataset_through_the_index_reporting_wrapper():
    from ptlab.lessons.ch03_data.datasets import AugmentWithNumpyRng
    from ptlab.workers import seed_worker_numpy_rng

    loader = DataLoader(AugmentWithNumpyRng(n=8), batch_size=2, num_workers=2, worker_init_fn=seed_worker_numpy_rng,
                        generator=torch.Generator().manual_seed(0))
    report = check_loader(loader, compute=lambda batch: None, warmup_batches=0, max_batches=4)
    assert report.samples == 8          # before: AttributeError from seed_worker_numpy_rng inside a worker


def test_checking_a_loader_leaves_its_shuffle_and_the_global_rng_as_they_were():
    def epoch(loader):
        return [int(i) for batch in loader for i in batch[0]]

    data = TensorDataset(torch.arange(32))
    checked = DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    untouched = DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    before = torch.get_rng_state()
    check_loader(checked, compute=lambda batch: None, warmup_batches=0, max_batches=2)
    assert torch.equal(torch.get_rng_state(), before)
    assert epoch(checked) == epoch(untouched)    # before: the check had used the loader's first shuffle


@pytest.mark.parametrize("share, workers, label, words", [
    (0.05, 0, "compute-bound", "the loader keeps up"),
    (0.28, 0, "partly input-bound", "waiting is ≈28% of the time"),
    (0.6, 0, "input-bound", "at most ≈2.5x faster"),
    (0.6, 10_000, "input-bound", "on a disk or the network, more workers than cores can still help"),
])
def test_the_verdict_is_graded_by_the_share_spent_waiting(share, workers, label, words):
    from ptlab.loader_check import _verdict

    verdict, next_step = _verdict(share, workers)
    assert verdict == label and words in next_step
    assert "keeps up" not in next_step or share < 0.1     # before: 28% waiting was "the loader keeps up"
