"""Chapter 6: mixed precision helpers, pitfalls and exercises."""
import platform

import pytest
import torch
from torch import nn

from ptlab.amp import format_op_table, format_speed_table, op_dtypes
from ptlab.course.pitfalls import all_pitfalls
from ptlab.lessons.ch06_amp.demos import running_sum, scale_history

AMP_IDS = {"scaler-update-forgotten", "scaler-update-before-step", "clip-without-unscale",
           "fp16-without-scaler", "deprecated-amp-spelling", "manual-half-vs-autocast",
           "gradscaler-default-device", "fp16-forward-overflow"}


def test_chapter_6_registers_the_amp_pitfalls():
    assert AMP_IDS <= {p.id for p in all_pitfalls(chapter=6)}


def test_gradscaler_default_device_rerun_without_cuda_matches_the_run_here():
    """The branch a GPU machine takes: the reproduction rerun in a child Python with CUDA hidden gives the
    run of a CPU-only machine (here, this process's own run)."""
    from ptlab.lessons.ch06_amp.pitfalls import _rerun_without_cuda, gradscaler_default_device

    child = _rerun_without_cuda(gradscaler_default_device, buggy=True)
    assert child.figures["CUDA available where it ran"] is False and child.figures["scaler._device"] == "cuda"
    if not torch.cuda.is_available():
        here = gradscaler_default_device(buggy=True)
        assert [(c.what, c.holds) for c in child.checks] == [(c.what, c.holds) for c in here.checks]
        assert child.texts == here.texts
    assert all(c.holds for c in child.checks)


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


@pytest.mark.cuda
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
    text = format_speed_table(speeds, {"float32": 0.875, "bf16 autocast": 0.8625},
                              {"float32": 0.25, "bf16 autocast": 0.125})
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

    speeds = {"float32": 100.0, "float32 + channels_last": 150.0, "bf16 autocast": 200.0, "bf16 + channels_last": 400.0}
    fractions = peak_fractions(speeds, 1e6, {"float32": 1e9, "bfloat16": 4e9})
    assert fractions == {"float32": 0.1, "float32 + channels_last": 0.15, "bf16 autocast": 0.05,
                         "bf16 + channels_last": 0.1}
    assert variant_dtype("bf16 + channels_last") == "bfloat16" and variant_dtype("float32") == "float32"
    assert variant_dtype("float32 + channels_last") == "float32"
    with pytest.raises(ValueError, match="bfloat16"):
        peak_fractions(speeds, 1e6, {"float32": 1e9})
    with pytest.raises(ValueError, match="unknown variant"):
        variant_dtype("fp8")


def test_class_subset_loaders_give_the_same_batches_on_every_call():
    from ptlab.lessons.ch06_amp.demos import class_subset_loaders

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
    assert list(speeds) == ["float32", "float32 + channels_last", "bf16 autocast", "bf16 + channels_last"]
    assert all(v > 0 for v in speeds.values())


def test_speed_table_widens_its_first_column_for_the_longest_variant():
    text = format_speed_table({"float32": 100.0, "float32 + channels_last": 150.0})
    header, fp32, fp32_cl = text.splitlines()
    assert header.index("images/CPU-s") == fp32.index("≈100") == fp32_cl.index("≈150") == 25


# --- which bf16 kernels run: bf16_matmul_kind ---------------------------------------------------------------

X86_NATIVE = dict(machine="x86_64", onednn=True, onednn_bf16=True, bf16_instructions=True)


@pytest.mark.parametrize("facts, kind", [
    (X86_NATIVE, "native"),                                                        # Zen 4, Sapphire Rapids
    ({**X86_NATIVE, "isa_cap": "avx512_core_bf16"}, "native"),                     # a cap at or above bf16
    ({**X86_NATIVE, "isa_cap": "AVX10_1_512_AMX"}, "native"),
    ({**X86_NATIVE, "isa_cap": "AVX512_CORE_VNNI"}, "emulated"),                   # capped below the instructions
    ({**X86_NATIVE, "bf16_instructions": False}, "emulated"),                      # Skylake-SP .. Ice Lake-SP
    ({**X86_NATIVE, "onednn_bf16": False, "bf16_instructions": False}, "fallback"),  # AVX2 only
    ({**X86_NATIVE, "onednn_bf16": False, "isa_cap": "AVX2"}, "fallback"),         # oneDNN capped at AVX2
    ({**X86_NATIVE, "onednn": False}, "fallback"),                                 # torch.backends.mkldnn off
    ({**X86_NATIVE, "machine": "AMD64"}, "native"),                                # Windows' name for x86-64
    (dict(machine="aarch64", onednn=True, onednn_bf16=True, bf16_instructions=False, arm_compute_library=True),
     "native"),                                                                    # Graviton 3 on Linux
    (dict(machine="arm64", onednn=True, onednn_bf16=False, bf16_instructions=False), "fallback"),   # Apple M1
    (dict(machine="arm64", onednn=True, onednn_bf16=True, bf16_instructions=False), "fallback"),    # M2+: no ACL
    (dict(machine="ppc64le", onednn=True, onednn_bf16=False, bf16_instructions=False), "fallback"),
])
def test_classify_bf16_kernels_from_what_torch_reports(facts, kind):
    from ptlab.amp import BF16_KINDS, classify_bf16_kernels

    got, reason = classify_bf16_kernels(**facts)
    assert got == kind and got in BF16_KINDS and reason
    if facts.get("isa_cap") == "AVX512_CORE_VNNI":
        assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI" in reason


def test_bf16_kind_band_and_agreement():
    from ptlab.amp import Bf16Kind

    assert Bf16Kind("native", "r", 2.4).agrees and not Bf16Kind("native", "r", 0.5).agrees
    assert Bf16Kind("emulated", "r", 0.45).agrees and not Bf16Kind("emulated", "r", 0.02).agrees
    assert Bf16Kind("fallback", "r", 0.02).agrees and not Bf16Kind("fallback", "r", 0.45).agrees
    assert Bf16Kind("fallback", "r").agrees is None
    assert "expected below 0.2x for fallback kernels" in str(Bf16Kind("fallback", "reason", 0.0166))
    assert "≈0.0166x" in str(Bf16Kind("fallback", "reason", 0.0166))


def _mock_torch_reports(monkeypatch, *, machine, system, processor, onednn_bf16, avx512_bf16=False, amx=False,
                        acl=False):
    """The platform and torch's answers as they are on another OS, and no /proc/cpuinfo to read."""
    import builtins
    import platform

    real_open = builtins.open

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(platform, "system", lambda: system)
    monkeypatch.setattr(platform, "processor", lambda: processor)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn_bf16)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch._C, "_has_mkldnn_acl", acl)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)


@pytest.mark.parametrize("os_facts, kind", [
    (dict(machine="AMD64", system="Windows", processor="AMD64 Family 25 Model 97", onednn_bf16=True,
          avx512_bf16=True), "native"),                                            # Zen 4 on Windows
    (dict(machine="AMD64", system="Windows", processor="Intel64 Family 6 Model 85", onednn_bf16=True),
     "emulated"),                                                                  # Cascade Lake on Windows
    (dict(machine="AMD64", system="Windows", processor="Intel64 Family 6 Model 154", onednn_bf16=False),
     "fallback"),                                                                  # AVX2-only laptop on Windows
    (dict(machine="arm64", system="Darwin", processor="arm", onednn_bf16=False), "fallback"),  # Apple M1
    (dict(machine="arm64", system="Darwin", processor="arm", onednn_bf16=True), "fallback"),   # Apple M2 and later
])
def test_bf16_matmul_kind_on_windows_and_macos_reads_torch_not_proc(monkeypatch, os_facts, kind):
    from ptlab.amp import bf16_matmul_kind, native_bf16

    _mock_torch_reports(monkeypatch, **os_facts)
    found = bf16_matmul_kind(peaks={"float32": 100e9, "bfloat16": 2e9})
    assert found.kind == kind and found.peak_ratio == 0.02
    assert native_bf16() is (kind == "native")


# Each environment of the course's configurations, and what it must give on this CPU.
OVERRIDES = {"defaults": {}, "ATEN_CPU_CAPABILITY=avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
             "ONEDNN_MAX_CPU_ISA=AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
             "ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}}
_PROBE = """
import json, torch
from ptlab.amp import bf16_matmul_kind
from ptlab.timing import matmul_flops
found = bf16_matmul_kind(peaks=matmul_flops((torch.float32, torch.bfloat16), min_seconds=0.02, threads=1))
print(json.dumps({"kind": found.kind, "agrees": found.agrees, "ratio": found.peak_ratio, "reason": found.reason}))
"""


def _expected_kind(override: str) -> str:
    """From the CPU's own features: ATen's capability never changes the kind, a oneDNN cap can lower it."""
    avx512 = torch.cpu._is_avx512_supported()
    bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    if override == "ONEDNN_MAX_CPU_ISA=AVX2" or not avx512:
        return "fallback"
    if override == "ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI" or not bf16:
        return "emulated"
    return "native"


@pytest.mark.slow
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the overrides are x86 ones")
@pytest.mark.parametrize("override", OVERRIDES)
def test_bf16_matmul_kind_under_each_override_matches_the_measured_peak(override):
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    done = subprocess.run([sys.executable, "-c", _PROBE], env={**env, **OVERRIDES[override]}, capture_output=True,
                          text=True, timeout=300, check=True)
    found = json.loads(done.stdout)
    assert found["kind"] == _expected_kind(override), found
    assert found["agrees"], found          # the measured bf16/float32 peak lies in the kind's band


def test_fp16_against_fp32_trains_both_runs_from_the_same_start():
    from ptlab.lessons.ch06_amp.demos import fp16_against_fp32

    runs = fp16_against_fp32("cpu", steps=4, batch_size=8, width=4, warmup=1)
    fp32, fp16 = runs["float32"], runs["float16 autocast + GradScaler"]
    assert abs(fp32["first loss"] - fp16["first loss"]) < 1e-2      # same weights, same first batch
    assert fp16["skipped steps"] == 0.0 and fp32["parameters float32"] and fp16["parameters float32"]
    assert fp32["images per second"] > 0 and fp16["images per second"] > 0
    with pytest.raises(ValueError, match="warmup"):
        fp16_against_fp32("cpu", steps=2, warmup=2)
