"""Chapter 6: mixed precision helpers, pitfalls and exercises."""
import pytest
import torch
from torch import nn

from ptlab.amp import format_op_table, format_speed_table, op_dtypes, running_sum, scale_history
from ptlab.course.pitfalls import all_pitfalls

AMP_IDS = {"scaler-update-forgotten", "scaler-update-before-step", "clip-without-unscale",
           "fp16-without-scaler", "deprecated-amp-spelling", "manual-half-vs-autocast"}


def test_chapter_6_registers_the_amp_pitfalls():
    assert AMP_IDS <= {p.id for p in all_pitfalls(chapter=6)}


def test_op_dtypes_matmul_low_losses_float32():
    table = {op: out for op, _, out in op_dtypes()}
    assert table["x @ w (matmul)"] == table["nn.Conv2d"] == table["F.linear"] == "bfloat16"
    assert table["F.cross_entropy"] == table["F.mse_loss"] == "float32"
    assert format_op_table(op_dtypes()).splitlines()[0].startswith("op")


def test_op_dtypes_takes_a_device_or_its_name():
    assert op_dtypes(torch.device("cpu")) == op_dtypes("cpu")


def test_op_dtypes_refuses_a_device_this_machine_does_not_have(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no cuda device on this machine"):
        op_dtypes("cuda", torch.float16)
    with pytest.raises(RuntimeError, match="no meta device"):
        op_dtypes("meta")                           # meta tensors hold no values: no policy to show


def test_op_dtypes_makes_every_tensor_on_the_device_asked_for_and_autocasts_there(monkeypatch):
    """The CUDA branch without a GPU: 'meta' stands in for the device; inside the autocast region every
    op's tensors are recorded (outside it, the values are drawn on the CPU and moved)."""
    import contextlib

    from torch.overrides import TorchFunctionMode

    import ptlab.amp

    class Devices(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.recording, self.seen, self.autocast = False, [], []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.recording:
                self.seen += [t.device.type for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)]
            return func(*args, **kwargs)

    mode = Devices()

    @contextlib.contextmanager
    def autocast(device_type, dtype=None, **kwargs):
        mode.autocast.append(device_type)
        mode.recording = True
        yield
        mode.recording = False

    monkeypatch.setattr(ptlab.amp, "_device_available", lambda device: True, raising=False)
    monkeypatch.setattr(torch, "autocast", autocast)
    with mode:
        rows = op_dtypes("meta", torch.float16)
    assert mode.autocast == ["meta"] and len(rows) == 11
    assert len(mode.seen) >= 11 and set(mode.seen) == {"meta"}, f"the table's ops ran on {set(mode.seen)}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: CUDA's autocast policy is not run")
def test_op_dtypes_on_cuda_gives_cudas_float16_policy():
    table = {op: out for op, _, out in op_dtypes("cuda", torch.float16)}
    assert table["x @ w (matmul)"] == table["nn.Conv2d"] == table["F.linear"] == "float16"
    assert table["F.cross_entropy"] == table["F.mse_loss"] == table["torch.softmax"] == "float32"


def test_scale_halves_after_inf_and_grows_back():
    history = scale_history(inf_at=(3,), steps=6, growth_interval=2, init_scale=1024.0)
    scales = [s for _, s, _ in history]
    skipped = [k for _, _, k in history]
    assert scales == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0]
    assert skipped == [False, False, True, False, False, False]


def test_bf16_running_sum_stalls_and_float32_accumulator_fixes_it():
    values = torch.full((1000,), 0.01)
    assert running_sum(values, torch.bfloat16) < 5
    assert abs(running_sum(values, torch.bfloat16, torch.float32) - 10.0) < 0.05


def test_speed_table_left_aligns_measured_figures():
    text = format_speed_table({"float32": 100.0, "bf16 autocast": 50.0}, {"float32": 0.5, "bf16 autocast": 0.5})
    assert "≈0.5 " in text and text.splitlines()[2].startswith("bf16 autocast         ≈50")


def test_speed_table_with_peak_fractions_and_accuracy_columns():
    speeds = {"float32": 100.0, "bf16 autocast": 150.0}
    text = format_speed_table(speeds, {"float32": 0.875, "bf16 autocast": 0.8625}, {"float32": 0.25, "bf16 autocast": 0.125})
    header, fp32, bf16 = text.splitlines()
    assert header.split() == ["variant", "images/CPU-s", "x", "float32", "of", "its", "matmul", "peak", "accuracy"]
    assert bf16 == "bf16 autocast         ≈150          ≈1.5        ≈0.12               ≈0.863"
    assert fp32.index("≈0.25") == header.index("of its") and fp32.index("≈0.875") == header.index("accuracy")
    with pytest.raises(ValueError, match="float32"):
        format_speed_table({"bf16 autocast": 1.0})


def _hand_counted_training_flops(model, shape=(3, 32, 32)):
    """2 FLOP per multiply-add; backward = input grad + weight grad, each as costly as forward,
    except the first convolution, whose input (the images) needs no gradient."""
    macs = []
    hooks = [m.register_forward_hook(lambda m, i, o: macs.append(
        o.numel() // o.shape[0] * (m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
                                   if isinstance(m, nn.Conv2d) else m.in_features)))
             for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    model(torch.zeros(2, *shape))
    for h in hooks:
        h.remove()
    return 2 * (3 * sum(macs) - macs[0])


def test_training_step_flops_matches_a_count_from_the_layer_shapes():
    from ptlab.amp import forward_flops, training_step_flops
    from ptlab.models import SmallCNN

    model = SmallCNN(width=24)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flops = training_step_flops(model)
    assert flops == _hand_counted_training_flops(SmallCNN(width=24)) == 34_510_464
    assert forward_flops(model) == 11_945_856       # 3 x forward minus the first conv's input gradient
    assert 2.8 < flops / forward_flops(model) < 3.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())   # BN stats untouched
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="input_shape"):
        training_step_flops(model, input_shape=[3, 32, 32])


def test_peak_fractions_divide_the_step_rate_by_its_dtype_peak():
    from ptlab.amp import peak_fractions, variant_dtype

    speeds = {"float32": 100.0, "bf16 autocast": 200.0, "bf16 + channels_last": 400.0}
    fractions = peak_fractions(speeds, 1e6, {"float32": 1e9, "bfloat16": 4e9})
    assert fractions == {"float32": 0.1, "bf16 autocast": 0.05, "bf16 + channels_last": 0.1}
    assert variant_dtype("bf16 + channels_last") == "bfloat16" and variant_dtype("float32") == "float32"
    with pytest.raises(ValueError, match="bfloat16"):
        peak_fractions(speeds, 1e6, {"float32": 1e9})
    with pytest.raises(ValueError, match="unknown variant"):
        variant_dtype("fp8")


def test_class_subset_loaders_give_the_same_batches_on_every_call():
    from ptlab.amp import class_subset_loaders

    train_a, val = class_subset_loaders(("circle", "stripes"), n_train=64, batch_size=16)
    train_b, _ = class_subset_loaders(("circle", "stripes"), n_train=64, batch_size=16)
    batches_a, batches_b = list(train_a), list(train_b)
    assert len(batches_a) == 4 and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                       for a, b in zip(batches_a, batches_b))
    assert len(val.dataset) == 160 and set(torch.cat([y for _, y in val]).tolist()) == {0, 1}
    with pytest.raises(ValueError, match="classes"):
        class_subset_loaders(("circle", "hexagon"))


def test_speed_comparison_returns_three_positive_speeds():
    from ptlab.amp import speed_comparison
    from ptlab.models import SmallCNN

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 3, 16, 16, generator=g), torch.tensor([0, 1, 2, 3])) for _ in range(2)]
    speeds = speed_comparison(lambda: SmallCNN(width=4), batches)
    assert list(speeds) == ["float32", "bf16 autocast", "bf16 + channels_last"]
    assert all(v > 0 for v in speeds.values())
