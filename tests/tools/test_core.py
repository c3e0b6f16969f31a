"""Device choice, seeding, timing and claims."""
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from ptlab import ClaimFailed, choose_device, claim, compare, get_device, seed_everything, time_callable
from ptlab.timing import format_seconds


def test_device_defaults_to_an_available_one(monkeypatch):
    monkeypatch.delenv("PTLAB_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert get_device().type == expected
    assert choose_device().reason


def test_device_env_override(monkeypatch):
    monkeypatch.setenv("PTLAB_DEVICE", "cpu")
    choice = choose_device()
    assert choice.device == torch.device("cpu") and "PTLAB_DEVICE" in choice.reason
    monkeypatch.setenv("PTLAB_DEVICE", "tpu")
    with pytest.raises(ValueError, match="PTLAB_DEVICE='tpu'"):
        get_device()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_env_asks_for_missing_cuda(monkeypatch):
    monkeypatch.setenv("PTLAB_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match="is_available"):
        get_device()


def test_seed_everything_repeats_all_generators():
    seed_everything(123)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(123)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
    with pytest.raises(ValueError, match="seed"):
        seed_everything(-1)


def test_import_changes_no_global_state():
    code = (
        "import warnings, torch, numpy as np\n"
        "filters = list(warnings.filters); seed = torch.initial_seed(); state = np.random.get_state()[1][:4].tolist()\n"
        "threads = torch.get_num_threads(); det = torch.are_deterministic_algorithms_enabled()\n"
        "import ptlab, ptlab.course.widgets, ptlab.course.pitfalls, ptlab.course.exercises, ptlab.course.catalogue\n"
        "ptlab.all_pitfalls()\n"
        "assert list(warnings.filters) == filters, 'warning filters changed'\n"
        "assert torch.initial_seed() == seed, 'torch seed changed'\n"
        "assert np.random.get_state()[1][:4].tolist() == state, 'numpy seed changed'\n"
        "assert torch.get_num_threads() == threads and torch.are_deterministic_algorithms_enabled() == det\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_time_callable_measures_sleep():
    timing = time_callable(lambda: time.sleep(0.01), warmup=0, repeats=3, name="sleep")
    assert len(timing.seconds) == 3 and 0.009 < timing.median < 0.2
    assert "sleep: median" in str(timing)


def test_compare_ratio_sees_the_slower_callable():
    result = compare(lambda: time.sleep(0.02), lambda: time.sleep(0.002), warmup=1, repeats=3, names=("slow", "fast"))
    assert result.ratio > 3
    assert "slow / fast" in str(result)


def test_timing_rejects_bad_arguments():
    with pytest.raises(ValueError, match="repeats"):
        time_callable(lambda: None, repeats=0)
    with pytest.raises(TypeError, match="callable"):
        time_callable(42)


def test_format_seconds_picks_units():
    assert format_seconds(2.5) == "2.5 s" and format_seconds(0.0031) == "3.1 ms"
    assert format_seconds(4.2e-6) == "4.2 µs" and format_seconds(5e-9) == "5 ns"


def test_claim_prints_and_raises(capsys):
    claim("two is even", 2 % 2 == 0, evidence="2 % 2 = 0")
    assert capsys.readouterr().out == "✔ two is even  [2 % 2 = 0]\n"
    with pytest.raises(ClaimFailed, match="three is even"):
        claim("three is even", 3 % 2 == 0)
    with pytest.raises(TypeError, match="single truth value"):
        claim("vector", torch.tensor([True, False]))
    claim("a one-element tensor is accepted", torch.tensor(True))


def test_kept_random_state_forks_the_accelerator_generators_of_the_devices_named(monkeypatch):
    from ptlab.core import kept_random_state

    seen = []
    real_fork = torch.random.fork_rng

    def recording_fork(devices=None, device_type="cuda", **kwargs):
        seen.append((devices, device_type))
        return real_fork(devices=[], **kwargs)           # record the request, fork the CPU only

    monkeypatch.setattr(torch.random, "fork_rng", recording_fork)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args, **kwargs: torch.device("cuda"))
    generator = torch.Generator().manual_seed(3)
    before, generator_before = torch.random.get_rng_state(), generator.get_state()
    devices = [torch.device("cuda", 1), torch.device("cpu"), "cuda:1", torch.device("cuda", 0), torch.device("mps", 0)]
    with kept_random_state(devices, [generator]):
        torch.rand(3), torch.rand(3, generator=generator)
    assert seen == [([0, 1], "cuda")]
    assert torch.equal(torch.random.get_rng_state(), before) and torch.equal(generator.get_state(), generator_before)


def test_atomic_write_leaves_the_old_file_and_no_temporary_when_the_write_fails(tmp_path):
    from ptlab.core import atomic_write

    path = atomic_write(tmp_path / "sub" / "f.bin", lambda handle: handle.write(b"old"))
    assert path.read_bytes() == b"old"

    def failing(handle):
        handle.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, failing)
    assert path.read_bytes() == b"old" and [p.name for p in path.parent.iterdir()] == ["f.bin"]
