"""ptlab.gpu_memory: the OOM search against a fake allocator, a snapshot read (a small snapshot in the format of
torch.cuda.memory._snapshot()), the message reader; the CUDA parts on a GPU only."""
import os
import weakref

import pytest
import torch
from torch import nn

from ptlab.gpu_memory import (NO_FRAME, TORCH_DIR, BatchSearch, LiveBlock, batch_step, bytes_under, format_holders,
                              frame_label, holders, largest_batch, live_blocks, memory_cap, memory_history,
                              oom_requested_bytes, oom_summary, peak_bytes)

MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
           "120.00 GiB is free. Including non-PyTorch memory, this process has 1.52 GiB memory in use.\n"
           "Of the allocated memory 1.01 GiB is allocated by PyTorch, and 12.00 MiB is reserved by PyTorch but "
           "unallocated.")


class FakeAllocator:
    """Holds `capacity` bytes; a batch of n needs n * per_image bytes, freed when the try ends or fails."""

    def __init__(self, capacity, per_image):
        self.capacity, self.per_image, self.in_use, self.frees = capacity, per_image, 0, 0

    def try_batch(self, n):
        need = n * self.per_image
        if self.in_use + need > self.capacity:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {need / 2**20:.2f} MiB.")
        self.in_use += need
        self.in_use -= need

    def free(self):
        self.frees += 1


def test_the_search_doubles_then_bisects_to_the_largest_batch_that_fits():
    fake = FakeAllocator(capacity=1000 * 2**20, per_image=2**20)                # 1000 images fit
    found = largest_batch(fake.try_batch, start=64, limit=2**16, after_failure=fake.free)
    assert (found.fits, found.fails) == (960, 1024)
    assert found.tried == [(64, True), (128, True), (256, True), (512, True), (1024, False), (768, True),
                           (896, True), (960, True)]
    assert fake.frees == 1 and found.error == "CUDA out of memory. Tried to allocate 1024.00 MiB."
    assert "largest batch that fit: 960; smallest that did not: 1024" in str(found)


def test_the_search_at_a_finer_granularity():
    fake = FakeAllocator(capacity=1000 * 2**20, per_image=2**20)
    assert largest_batch(fake.try_batch, start=64, limit=2**16, granularity=8, after_failure=fake.free).fits == 1000


def test_when_nothing_fits_or_everything_fits():
    fake = FakeAllocator(capacity=10, per_image=100)
    assert largest_batch(fake.try_batch, 1, 64, after_failure=fake.free) == BatchSearch(
        None, 1, [(1, False)], "CUDA out of memory. Tried to allocate 0.00 MiB.")
    roomy = FakeAllocator(capacity=10**12, per_image=1)
    found = largest_batch(roomy.try_batch, 16, 100, after_failure=roomy.free)
    assert (found.fits, found.fails, found.error) == (64, None, "")


def test_other_errors_are_not_swallowed():
    def broken(n):
        raise ValueError("a bug, not memory")
    with pytest.raises(ValueError, match="a bug"):
        largest_batch(broken, 1, 8, after_failure=lambda: None)


@pytest.mark.parametrize("kwargs, message", [
    ({"start": 0, "limit": 8}, "start must be a positive int"),
    ({"start": 16, "limit": 8}, r"limit \(8\) must be at least start \(16\)"),
    ({"start": 1, "limit": 8, "granularity": 0}, "granularity must be a positive int"),
])
def test_bad_search_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        largest_batch(lambda n: None, **kwargs)


def test_the_search_releases_the_failed_tensors_before_the_next_try():
    """The error's traceback holds the failed try's locals: they must be gone when after_failure runs."""
    alive = []

    class Big:
        pass

    def try_batch(n):
        held = Big()
        alive.append(weakref.ref(held))
        if n > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")

    seen = []
    largest_batch(try_batch, 1, 64, after_failure=lambda: seen.append([r() is None for r in alive]))
    assert seen and all(all(gone) for gone in seen)


def _frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


CONV = _frame(os.path.join(TORCH_DIR, "nn", "modules", "conv.py"), 548, "_conv_forward")
CONV_FWD = _frame(os.path.join(TORCH_DIR, "nn", "modules", "conv.py"), 553, "forward")
CALL = _frame(os.path.join(TORCH_DIR, "nn", "modules", "module.py"), 1786, "_call_impl")
MODEL = _frame("/home/me/project/ptlab/models.py", 40, "forward")
CELL = _frame("/tmp/ipykernel_1/123.py", 5, "<module>")
TO = _frame(os.path.join(TORCH_DIR, "nn", "modules", "module.py"), 1355, "convert")

SNAPSHOT = {   # the format of torch.cuda.memory._snapshot(), hand-made: two devices, every block state
    "segments": [
        {"device": 0, "address": 0, "total_size": 8 * 2**20, "stream": 0, "segment_type": "large",
         "allocated_size": 6 * 2**20, "active_size": 6 * 2**20, "blocks": [
             {"size": 4 * 2**20, "requested_size": 4 * 2**20, "address": 0, "state": "active_allocated",
              "frames": [CONV, CONV_FWD, CALL, MODEL, CALL, CELL]},
             {"size": 2 * 2**20, "requested_size": 2 * 2**20, "address": 4 * 2**20, "state": "active_allocated",
              "frames": [CONV, CONV_FWD, CALL, MODEL, CALL, CELL]},
             {"size": 2 * 2**20, "requested_size": 0, "address": 6 * 2**20, "state": "inactive", "frames": []}]},
        {"device": 0, "address": 2**30, "total_size": 2**20, "stream": 0, "segment_type": "small",
         "allocated_size": 2**20, "active_size": 2**20, "blocks": [
             {"size": 512 * 2**10, "requested_size": 500 * 2**10, "address": 2**30, "state": "active_allocated",
              "frames": [TO, CELL]},
             {"size": 512 * 2**10, "requested_size": 512 * 2**10, "address": 2**30 + 2**19,
              "state": "active_allocated", "frames": []}]},
        {"device": 1, "address": 0, "total_size": 2**20, "stream": 0, "segment_type": "large",
         "allocated_size": 2**20, "active_size": 2**20, "blocks": [
             {"size": 2**20, "requested_size": 2**20, "address": 0, "state": "active_allocated", "frames": [CELL]}]},
    ],
    "device_traces": [[], []],
}


def test_live_blocks_are_the_allocated_blocks_of_the_device_asked_for():
    blocks = live_blocks(SNAPSHOT, device=0)
    assert [b.size for b in blocks] == [4 * 2**20, 2 * 2**20, 512 * 2**10, 512 * 2**10]
    assert len(live_blocks(SNAPSHOT)) == 5 and sum(b.size for b in live_blocks(SNAPSHOT, device=1)) == 2**20


def test_a_block_is_labelled_by_its_innermost_frame_and_the_first_frame_outside_torch():
    assert frame_label((CONV, CONV_FWD, CALL, MODEL, CALL, CELL)) == \
        "conv.py:548 _conv_forward  <- models.py:40 forward"
    assert frame_label((CELL,)) == "123.py:5 <module>"
    assert frame_label(()) == NO_FRAME


def test_holders_group_the_live_blocks_largest_first():
    found = holders(live_blocks(SNAPSHOT, device=0))
    assert [(h.label, h.bytes, h.blocks) for h in found] == [
        ("conv.py:548 _conv_forward  <- models.py:40 forward", 6 * 2**20, 2),
        (NO_FRAME, 512 * 2**10, 1),                                          # ties: by label
        ("module.py:1355 convert  <- 123.py:5 <module>", 512 * 2**10, 1)]
    table = format_holders(found, top=2).splitlines()
    assert table[1].startswith("6.00      85.7%   2       conv.py:548")
    assert table[-1].startswith("0.50      7.1%    1       (1 more places)")


def test_bytes_under_a_function_counts_blocks_allocated_inside_it():
    blocks = live_blocks(SNAPSHOT, device=0)
    assert bytes_under(blocks, "forward") == 6 * 2**20 and bytes_under(blocks, "convert") == 512 * 2**10


def test_a_snapshot_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="must be the dict torch.cuda.memory._snapshot"):
        live_blocks([LiveBlock(1, ())])


def test_the_out_of_memory_message_is_read():
    assert oom_requested_bytes(MESSAGE) == 2 * 2**30
    assert oom_requested_bytes("CUDA out of memory. Allocation was preemptively rejected because it would exceed "
                               "per_process_memory_fraction limit. Requested size: 512.00 MiB") == 512 * 2**20
    assert oom_requested_bytes("something else") is None
    assert oom_summary(MESSAGE).startswith("CUDA out of memory. Tried to allocate 2.00 GiB.")


def test_the_cuda_tools_refuse_the_cpu_by_name():
    for call in (lambda: peak_bytes(lambda: None, "cpu"), lambda: memory_cap(2**20, "cpu").__enter__(),
                 lambda: memory_history(10, "cpu").__enter__()):
        with pytest.raises(ValueError, match="device must be a CUDA device, got cpu"):
            call()
    with pytest.raises(ValueError, match="extra_bytes must be a positive int"):
        memory_cap(0, "cpu").__enter__()


def test_batch_step_trains_at_any_batch_size_on_the_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))
    step = batch_step(model, torch.optim.SGD(model.parameters(), lr=0.1), image_size=8)
    before = model[0].weight.detach().clone()
    step(3)
    assert not torch.equal(before, model[0].weight) and all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        step(0)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@cuda
def test_on_a_gpu_an_oom_under_a_cap_is_caught_and_the_cap_lifted():
    before = torch.cuda.get_per_process_memory_fraction()
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(64, 10)).cuda()
    step = batch_step(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with memory_cap(256 * 2**20):
        found = largest_batch(step, 64, 2**16)
    assert found.fails is not None and found.fits is not None and found.fits < found.fails
    assert torch.cuda.get_per_process_memory_fraction() == before
    step(found.fits)                                          # memory was given back


@pytest.mark.cuda
@cuda
def test_on_a_gpu_a_snapshot_adds_up_to_memory_allocated_and_names_the_forward():
    with memory_history(10_000):
        model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU()).cuda()
        out = model(torch.randn(256, 3, 32, 32, device="cuda"))
        snapshot = torch.cuda.memory._snapshot()
        allocated = torch.cuda.memory_allocated()
    blocks = live_blocks(snapshot, device=torch.cuda.current_device())
    assert abs(sum(b.size for b in blocks) / allocated - 1) < 0.01    # the same block sizes: exactly, in principle
    assert bytes_under(blocks, "forward") >= out.numel() * 4
    assert peak_bytes(lambda: model(torch.randn(64, 3, 32, 32, device="cuda"))) > 0


def test_memory_cap_hands_torch_an_indexed_device(monkeypatch):
    """torch.cuda.{get,set}_per_process_memory_fraction call _get_device_index without optional=True, so a bare
    torch.device("cuda") raises ValueError there (torch/cuda/memory.py): memory_cap must resolve the index."""
    from torch.cuda._utils import _get_device_index

    calls = []

    def get_fraction(device=None):
        calls.append(("get", device))
        _get_device_index(device)                   # what torch does with it: raises on a device without index
        return 1.0

    def set_fraction(fraction, device=None):
        calls.append(("set", fraction, device))
        _get_device_index(device)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("P", (), {"total_memory": 2**30}))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", get_fraction)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    for device in ("cuda", torch.device("cuda"), "cuda:3"):
        calls.clear()
        with memory_cap(2**28, device) as cap:
            assert cap == 2**28
        assert [c[0] for c in calls] == ["get", "set", "set"]
        assert all(c[-1] == torch.device("cuda", 3) for c in calls), calls
        assert calls[1][1] == 0.25 and calls[2][1] == 1.0                        # capped, then restored
