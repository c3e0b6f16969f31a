"""ptlab.timing: side-by-side timing and the measured matmul peak."""
import pytest
import torch

from ptlab.timing import compare, matmul_flops, time_callable, torch_threads


def test_matmul_flops_gives_one_positive_rate_per_dtype():
    peaks = matmul_flops((torch.float32, torch.bfloat16), max_size=256, repeats=2)
    assert list(peaks) == ["float32", "bfloat16"]
    assert all(isinstance(v, float) and v > 0 for v in peaks.values())


def test_matmul_flops_grows_the_size_until_a_product_takes_min_seconds(monkeypatch):
    import ptlab.timing as timing

    sizes = []
    real_once = timing._once

    def spy(fn, device, clock="wall"):
        sizes.append(fn().shape[0])               # the product is square: its size is n
        return real_once(fn, device, clock)

    monkeypatch.setattr(timing, "_once", spy)
    timing.matmul_flops((torch.float32,), min_seconds=1e9, max_size=1024, repeats=1)
    assert sizes == [256, 512, 1024, 1024]        # 3 probes, then 1 timed repeat at the size reached
    sizes.clear()
    timing.matmul_flops((torch.float32,), min_seconds=1e-9, max_size=1024, repeats=1)
    assert sizes == [256, 256]                    # the first product already took min_seconds


@pytest.mark.parametrize("kwargs, error", [
    ({"dtypes": (torch.int64,)}, ValueError), ({"dtypes": "float32"}, TypeError), ({"dtypes": ()}, TypeError),
    ({"min_seconds": 0}, ValueError), ({"max_size": 100}, ValueError), ({"repeats": 0}, ValueError),
    ({"clock": "sundial"}, ValueError), ({"threads": 0}, ValueError),
])
def test_matmul_flops_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        matmul_flops(**{"max_size": 256, **kwargs})


def test_compare_and_time_callable_report_every_repeat():
    comparison = compare(lambda: sum(range(1000)), lambda: sum(range(10)), repeats=3, names=("long", "short"))
    assert len(comparison.a.seconds) == len(comparison.b.seconds) == 3
    assert "long / short" in str(comparison)
    assert len(time_callable(lambda: None, repeats=2).seconds) == 2


def test_torch_threads_sets_the_count_for_the_block_and_restores_it():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("a failed measurement")
    assert torch.get_num_threads() == before
    matmul_flops((torch.float32,), max_size=256, repeats=1, threads=1)
    assert torch.get_num_threads() == before
