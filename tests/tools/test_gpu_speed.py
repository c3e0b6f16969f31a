"""ptlab.gpu_speed on the CPU: the levers' gates, the restored flags, the side-by-side measurement's shape, the
fixed share's arithmetic; the speeds themselves are measured on a GPU (the cuda tests and chapter 6)."""
import pytest
import torch
from torch import nn

from ptlab.gpu_speed import (FLOAT16, FLOAT32, LEVERS, Lever, LeverSpeeds, backend_settings, fixed_share, format_levers,
                             make_step, speed_levers, step_seconds, tf32_matmul_error, why_skipped)


def tiny_cnn():
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 10))


def flags():
    return (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)


def new_api_flag():
    return torch.backends.cuda.matmul.fp32_precision       # set_float32_matmul_precision writes it too


def test_backend_settings_set_the_flags_and_restore_them_even_after_an_error():
    before, before_new = flags(), new_api_flag()
    with backend_settings(tf32=True, cudnn_benchmark=True):
        assert flags() == ("high", True, True) and torch.backends.cuda.matmul.allow_tf32
    assert flags() == before
    with pytest.raises(RuntimeError, match="inside"):
        with backend_settings(tf32=False, cudnn_benchmark=True):
            assert flags() == ("highest", False, True)
            raise RuntimeError("inside")
    assert flags() == before and new_api_flag() == before_new
    with backend_settings():                                   # None leaves every flag alone
        assert flags() == before
    assert new_api_flag() == before_new


def test_backend_settings_restore_the_new_api_matmul_flag():
    before = new_api_flag()
    try:
        torch.backends.cuda.matmul.fp32_precision = "none"
        with backend_settings(tf32=False):                     # "highest" writes "ieee" to the new-API flag
            assert new_api_flag() == "ieee"
        assert new_api_flag() == "none" and torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


def test_backend_settings_refuse_a_non_bool():
    with pytest.raises(TypeError, match="tf32 must be True, False or None"):
        with backend_settings(tf32="high"):
            pass


def test_each_lever_is_gated_by_the_tensor_cores_it_needs():
    names = {lever.name: lever for lever in LEVERS}
    volta, ampere = (7, 0), (8, 0)
    assert why_skipped(FLOAT32, (6, 1)) is None
    pascal = why_skipped(FLOAT16, (6, 1))
    assert "needs compute capability 7.0" in pascal and "this GPU has 6.1" in pascal
    assert why_skipped(FLOAT16, volta) is None
    for name in ("TF32", "bfloat16 autocast", "bfloat16 + channels_last"):
        assert "needs compute capability 8.0" in why_skipped(names[name], (7, 5))
        assert why_skipped(names[name], ampere) is None
    assert why_skipped(names["TF32"], None) is None                  # a CPU: no gate
    assert FLOAT16.scaler and not names["bfloat16 autocast"].scaler and not FLOAT32.scaler


def test_a_lever_with_another_dtype_is_refused():
    with pytest.raises(ValueError, match="autocast_dtype must be None, torch.float16 or torch.bfloat16"):
        Lever("float64", torch.float64)


def test_make_step_trains_and_returns_the_loss_without_reading_it():
    torch.manual_seed(0)
    model = tiny_cnn()
    before = [p.detach().clone() for p in model.parameters()]
    step = make_step(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(8, 3, 8, 8),
                     torch.randint(0, 10, (8,)))
    loss = step()
    assert loss.shape == () and not loss.requires_grad
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_make_step_refuses_a_batch_split_over_devices():
    model = tiny_cnn()
    with pytest.raises(ValueError, match="images are on cpu and labels on meta"):
        make_step(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(2, 3, 8, 8),
                  torch.zeros(2, dtype=torch.long, device="meta"))


def test_speed_levers_measures_each_lever_that_can_run_and_names_the_others():
    levers = (FLOAT32, Lever("float32 + channels_last", channels_last=True), Lever("bfloat16 autocast", torch.bfloat16))
    speeds = speed_levers(tiny_cnn, batch_size=4, image_size=8, levers=levers, device="cpu", steps=1, rounds=1,
                          warmup=0, capability=(7, 5))
    assert list(speeds.images_per_second) == ["float32, TF32 off", "float32 + channels_last"]
    assert speeds.skipped == {"bfloat16 autocast": "needs compute capability 8.0 or more (its tensor cores); "
                                                   "this GPU has 7.5"}
    assert speeds.ratio("float32, TF32 off") == 1.0 and speeds.ratio("float32 + channels_last") > 0
    table = str(speeds).splitlines()
    assert table[0].split() == ["lever", "images/s", "x", "float32,", "TF32", "off"]
    assert table[-1].startswith("bfloat16 autocast") and "skipped: needs compute capability 8.0" in table[-1]
    with pytest.raises(KeyError, match="did not run"):
        speeds.ratio("bfloat16 autocast")


def test_every_lever_at_one_batch_size_trains_on_the_same_batch(monkeypatch):
    import ptlab.gpu_speed as gpu_speed

    seen = []
    real = gpu_speed.make_step

    def spy(model, optimizer, images, labels, **kwargs):
        seen.append((images.shape[0], images, labels))
        return real(model, optimizer, images, labels, **kwargs)

    monkeypatch.setattr(gpu_speed, "make_step", spy)
    layout = Lever("float32 + channels_last", channels_last=True)
    step_seconds(tiny_cnn, [(FLOAT32, 4), (layout, 4), (FLOAT32, 6), (layout, 6)], image_size=8, device="cpu",
                 steps=1, rounds=1, warmup=0)
    assert [n for n, _, _ in seen] == [4, 4, 6, 6]
    for (_, a, la), (_, b, lb) in (seen[0:2], seen[2:4]):
        assert torch.equal(a, b) and torch.equal(la, lb)                   # same values, whatever the layout
        assert b.is_contiguous(memory_format=torch.channels_last) and a.is_contiguous()


def test_there_is_no_cudnn_benchmark_lever():
    """ATen's cuDNN plan cache ignores the benchmark flag within a process: such a lever would measure nothing."""
    assert not any("benchmark" in lever.name for lever in LEVERS)
    assert not hasattr(FLOAT32, "cudnn_benchmark")
    assert "cudnn.benchmark" in speed_levers.__doc__ and "fresh process" in speed_levers.__doc__


def test_step_seconds_keys_each_lever_and_batch_size():
    times = step_seconds(tiny_cnn, [(FLOAT32, 4), (FLOAT32, 8), (FLOAT16, 4)], image_size=8, device="cpu", steps=1,
                         rounds=2, warmup=1, capability=(6, 1))
    assert set(times.seconds) == {("float32, TF32 off", 4), ("float32, TF32 off", 8)}
    assert set(times.skipped) == {("float16 autocast + GradScaler", 4)}
    assert times.images_per_second("float32, TF32 off", 8) == 8 / times.seconds["float32, TF32 off", 8]


@pytest.mark.parametrize("kwargs, message", [
    ({"runs": []}, "runs must be a non-empty list"),
    ({"runs": [(FLOAT32, 0)]}, "runs must be a non-empty list"),
    ({"runs": [(FLOAT32, 4)], "steps": 0}, "steps must be an int >= 1"),
    ({"runs": [(FLOAT32, 4)], "warmup": -1}, "warmup must be an int >= 0"),
])
def test_step_seconds_names_a_bad_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        step_seconds(tiny_cnn, device="cpu", **kwargs)


def test_speed_levers_needs_a_baseline_that_runs_everywhere():
    with pytest.raises(ValueError, match="must start with a baseline"):
        speed_levers(tiny_cnn, levers=(FLOAT16, FLOAT32), device="cpu")


def test_fixed_share_reads_the_part_that_does_not_grow_with_the_batch():
    assert fixed_share(1.0, 1.0, 4) == 1.0                # the same time at 4x the batch: all fixed
    assert fixed_share(1.0, 4.0, 4) == 0.0                # 4x the time: nothing fixed
    assert fixed_share(2.0, 5.0, 4) == pytest.approx(0.5) # t = 1 + B, B = 1 and 4
    assert fixed_share(1.0, 5.0, 4) == 0.0                # worse than linear: kept at 0
    with pytest.raises(ValueError, match="factor must be a number above 1"):
        fixed_share(1.0, 2.0, 1)
    with pytest.raises(ValueError, match="seconds_large must be a positive number"):
        fixed_share(1.0, 0.0, 4)


def test_tf32_matmul_error_restores_the_precision_and_is_tiny_in_float32_on_the_cpu():
    before = flags()
    errors = tf32_matmul_error("cpu", size=64)
    assert flags() == before and set(errors) == {"highest", "high"}
    assert errors["highest"] < 1e-5


def test_lever_speeds_ratio_is_against_the_baseline():
    speeds = LeverSpeeds({"float32, TF32 off": 100.0, "TF32": 180.0}, {})
    assert speeds.ratio("TF32") == pytest.approx(1.8)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_tf32_changes_a_matmul_where_the_gpu_has_it():
    errors = tf32_matmul_error("cuda")
    if torch.cuda.get_device_capability() >= (8, 0):
        assert errors["high"] > 10 * errors["highest"]
    else:
        assert errors["high"] == pytest.approx(errors["highest"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_every_lever_runs_or_says_why():
    speeds = speed_levers(tiny_cnn, batch_size=8, image_size=16, steps=1, rounds=1, warmup=1)
    assert set(speeds.images_per_second) | set(speeds.skipped) == {lever.name for lever in LEVERS}


def test_format_levers_says_what_each_lever_sets_and_needs():
    rows = format_levers().splitlines()
    assert rows[0].split() == ["lever", "autocast", "layout", "TF32", "needs"]
    assert rows[1].startswith("float32, TF32 off") and rows[1].endswith("any GPU")
    assert rows[4].startswith("float16 autocast + GradScaler") and rows[4].split()[-1] == "7.0"
    assert len(rows) == 1 + len(LEVERS)
