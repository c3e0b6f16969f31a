"""ptlab.speed_ladder: the rungs, the two ways of loading, the table, the report, a real climb and bad input."""
import dataclasses
import itertools
import math

import pytest
import torch

import ptlab.speed_ladder as speed_ladder_module
from ptlab.amp import bf16_matmul_kind
from ptlab.data import uint8_split
from ptlab.speed_ladder import Ladder, Rung, Setup, _batches, _training_step, format_ladder, ladder_rungs, speed_ladder


def test_each_rung_adds_exactly_one_change_to_the_one_before():
    rungs = ladder_rungs(batch_size=16, large_batch_size=64)
    assert [name for name, _ in rungs] == ["naive: float32, batch 16", "+ channels_last", "+ bf16 autocast",
                                           "+ torch.compile(model)", "+ fused AdamW", "+ batch 64",
                                           "+ preloaded batches"]
    assert rungs[0][1] == Setup(batch_size=16)
    for (_, before), (_, after) in itertools.pairwise(rungs):
        changed = [f.name for f in dataclasses.fields(Setup) if getattr(before, f.name) != getattr(after, f.name)]
        assert len(changed) == 1
    assert rungs[-1][1] == Setup(64, channels_last=True, bf16=True, compiled=True, fused=True, preloaded=True)


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size must be a positive int, got 0"),
    ({"batch_size": 32, "large_batch_size": 32}, "large_batch_size must be larger than batch_size=32, got 32"),
    ({"large_batch_size": 2.5}, "large_batch_size must be a positive int, got 2.5"),
])
def test_ladder_rungs_refuses_bad_batch_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ladder_rungs(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"width": 0}, "width must be a positive int"),
    ({"steps": True}, "steps must be a positive int"),
    ({"warmup": 0}, "warmup must be an int >= 1"),
    ({"bf16": "yes"}, "bf16 must be None"),
    ({"lr": -1}, "lr must be a positive number"),
    ({"threads": 0}, "threads must be a positive int or None"),
    ({"batch_size": 64, "large_batch_size": 8}, "large_batch_size must be larger than batch_size=64"),
])
def test_speed_ladder_refuses_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        speed_ladder(**kwargs)


def _epoch(setup, images, labels):
    batches = list(itertools.islice(_batches(setup, images, labels, seed=0), len(labels) // setup.batch_size))
    return torch.cat([X for X, _ in batches]), torch.cat([y for _, y in batches])


def test_both_ways_of_loading_give_the_same_labels_and_per_image_pixel_sums_in_an_epoch():
    """The loading rung changes how batches are made, not what they hold."""
    images, labels = (t[:64] for t in uint8_split(train=True))
    per_item = _epoch(Setup(8), images, labels)
    preloaded = _epoch(Setup(8, preloaded=True), images, labels)
    for X, y in (per_item, preloaded):
        assert X.shape == (64, 3, 32, 32) and X.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(per_item[1].sort().values, preloaded[1].sort().values)
    sums = [X.flatten(1).sum(1).sort().values for X, _ in (per_item, preloaded)]
    assert torch.allclose(sums[0], sums[1], atol=1e-3)
    assert not torch.equal(per_item[1], labels)                  # shuffled


def test_a_training_step_updates_every_parameter_in_every_setup_without_compiling():
    images, labels = (t[:32] for t in uint8_split(train=True))
    for setup in (Setup(8), Setup(8, channels_last=True, fused=True, preloaded=True), Setup(8, bf16=True)):
        torch.manual_seed(0)
        model = speed_ladder_module.SmallCNN(width=4)
        before = [p.detach().clone() for p in model.parameters()]
        step = _training_step(setup, lambda: model, _batches(setup, images, labels, 0), lr=1e-2)
        n, load_cpu = step()
        assert n == 8 and load_cpu >= 0
        assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
        assert model.features[0][0].weight.is_contiguous(memory_format=torch.channels_last) == setup.channels_last


def _ladder():
    rungs = ladder_rungs(8, 16)
    speeds = [100.0, 150.0, None, 120.0, 120.0, 240.0, 360.0]
    loads = [2e-3, 2e-3, None, 2e-3, 2e-3, 1e-3, 1e-4]          # CPU-seconds per image to load a batch
    made = tuple(Rung(name, s, ips, skipped="" if ips else "fallback bf16 kernels here",
                      compile_seconds=2.0 if s.compiled and ips else None, load_cpu_s_per_image=load)
                 for (name, s), ips, load in zip(rungs, speeds, loads))
    return Ladder(made, threads=1, steps=3, warmup=1)


def test_loading_ratios_and_shares():
    ladder = _ladder()
    assert ladder.load_ratio("+ preloaded batches") == pytest.approx(10.0)   # 1e-3 / 1e-4 per image
    assert ladder.load_share("+ batch 16") == pytest.approx(0.24)            # 1e-3 s of 1 / 240 s per image
    with pytest.raises(ValueError, match="load_ratio needs a measured rung after the first"):
        ladder.load_ratio("naive: float32, batch 8")
    with pytest.raises(ValueError, match="was skipped"):
        ladder.load_share("+ bf16 autocast")


def test_ratios_skip_the_skipped_rung():
    ladder = _ladder()
    assert ladder.ratio("naive: float32, batch 8") == 1.0
    assert ladder.ratio("+ channels_last") == 1.5
    assert ladder.ratio("+ torch.compile(model)") == 0.8           # against channels_last: bf16 was skipped
    assert ladder.to_naive("+ preloaded batches") == 3.6
    assert ladder.compile_seconds == 8.0
    with pytest.raises(ValueError, match="rung '\\+ bf16 autocast' was skipped \\(fallback bf16 kernels here\\)"):
        ladder.ratio("+ bf16 autocast")
    with pytest.raises(KeyError, match="no rung named 'turbo'"):
        ladder["turbo"]


def test_format_ladder_left_aligns_figures_and_explains_a_skip():
    lines = format_ladder(_ladder()).splitlines()
    assert lines[0].split() == ["rung", "images/CPU-s", "x", "previous", "x", "naive"]
    assert lines[2].split()[2:] == ["≈150", "≈1.5", "≈1.5"]
    assert lines[2].index("≈150") == lines[0].index("images/CPU-s")
    assert lines[3].endswith("skipped (below)")
    assert lines[8] == "+ bf16 autocast skipped: fallback bf16 kernels here"
    assert lines[9].startswith("first step of the 4 compiled rungs") and lines[9].endswith("≈8 s")
    with pytest.raises(TypeError, match="format_ladder takes a Ladder"):
        format_ladder({"naive": 1.0})


@pytest.mark.slow
def test_a_real_climb_measures_every_rung_it_can_and_skips_bf16_where_it_is_not_native():
    ladder = speed_ladder(steps=1, warmup=1)
    native = bf16_matmul_kind(measure=False).kind == "native"
    assert [r.name for r in ladder.rungs] == [name for name, _ in ladder_rungs()]
    assert (ladder["+ bf16 autocast"].images_per_cpu_s is not None) == native
    assert (ladder["+ bf16 autocast"].skipped == "") == native
    assert all(r.setup.bf16 == (native and i >= 2) for i, r in enumerate(ladder.rungs))
    assert all(r.images_per_cpu_s > 0 for r in ladder.measured_rungs)
    assert all(0 < r.load_cpu_s_per_image < 1 / r.images_per_cpu_s for r in ladder.measured_rungs)
    assert [r.name for r in ladder.rungs if r.compile_seconds is not None] == [
        "+ torch.compile(model)", "+ fused AdamW", "+ batch 128", "+ preloaded batches"]
    product = math.prod(ladder.ratio(r.name) for r in ladder.measured_rungs)
    assert product == pytest.approx(ladder.to_naive("+ preloaded batches"))
    assert ladder.threads == 1 and torch.get_num_threads() >= 1
    forced = speed_ladder(steps=1, warmup=1, bf16=False)
    assert forced["+ bf16 autocast"].skipped == "bf16=False" and not any(r.setup.bf16 for r in forced.rungs)


def test_the_naive_rungs_adamw_defaults_to_the_per_parameter_loop_on_the_cpu():
    """What chapter 8 says of the naive rung: for CPU tensors AdamW's default is neither fused nor foreach."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = list(speed_ladder_module.SmallCNN(width=4).parameters())
    assert _default_to_fused_or_foreach(params, differentiable=False, use_fused=False) == (False, False)
    assert torch.optim.AdamW(params).defaults["foreach"] is None and torch.optim.AdamW(params).defaults["fused"] is None
