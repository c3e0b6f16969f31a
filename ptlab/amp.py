"""Mixed precision, measured: which dtype autocast gives each op, which kind of bf16 matmul kernel torch runs on
this CPU (native, emulated by oneDNN, or torch's fallback) with the measured bf16/float32 peak as evidence, a
side-by-side speed comparison of float32 and bf16 autocast training in both memory layouts, and the FLOP a
training step needs (for the fraction of the measured matmul peak it reaches). Introduced in chapter 6."""
from __future__ import annotations

import copy
import math
import os
import platform
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .claims import measured
from .timing import matmul_flops, torch_threads


def _step_fn(model: nn.Module, dtype: torch.dtype | None, channels_last: bool):
    """One training step of `model` on a batch, in float32 (dtype None) or under autocast to `dtype`."""
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()

    def step(X: torch.Tensor, y: torch.Tensor) -> None:
        if channels_last:
            X = X.contiguous(memory_format=torch.channels_last)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = F.cross_entropy(model(X), y)
        loss.backward()
        opt.step()

    return step


# name: (autocast dtype or None for plain float32, whether the model and inputs are channels_last).
# Each layout has a float32 row, so a ratio within one layout shows what bf16 buys and the float32 rows
# show what the layout alone buys.
VARIANTS = {"float32": (None, False), "float32 + channels_last": (None, True),
            "bf16 autocast": (torch.bfloat16, False), "bf16 + channels_last": (torch.bfloat16, True)}


def variant_dtype(name: str) -> str:
    """The dtype a variant's matmuls and convolutions run in: 'float32' or 'bfloat16'."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; the variants are {', '.join(VARIANTS)}")
    dtype = VARIANTS[name][0]
    return "float32" if dtype is None else str(dtype).replace("torch.", "")


def speed_comparison(make_model: Callable[[], nn.Module], batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                     warmup: int = 1, threads: int | None = 1) -> dict[str, float]:
    """Training speed of one model in each of VARIANTS (float32 and bf16 autocast, each in the default NCHW layout
    and in channels_last), in images per CPU-second.

    Each variant trains its own copy (`make_model()`) on the same batches. The variants take turns
    step by step (so load on the machine hits all alike), the first `warmup` steps are not timed, and
    each variant's speed is its fastest timed step in CPU time of this process: on a loaded machine,
    wall time also counts the time other processes hold the cores, CPU time does not. It runs on
    `threads` torch threads (1 by default; None: as set): with several, a thread waiting for a sibling
    that lost its core spins and burns CPU time, so on a shared machine even CPU time gets noisy.
    """
    with torch_threads(threads):
        return _speed_comparison(make_model, batches, warmup)


def _speed_comparison(make_model, batches, warmup: int) -> dict[str, float]:
    steps = {name: _step_fn(make_model(), dtype, cl) for name, (dtype, cl) in VARIANTS.items()}
    best = {name: float("inf") for name in VARIANTS}
    for i, (X, y) in enumerate(batches):
        for name, step in steps.items():
            start = time.process_time()
            step(X, y)
            elapsed = time.process_time() - start
            if i >= warmup:
                best[name] = min(best[name], elapsed / len(y))
    if any(t == float("inf") for t in best.values()):
        raise ValueError(f"speed_comparison needs more than warmup={warmup} batches")
    return {name: 1.0 / t for name, t in best.items()}


def _counted_flops(model: nn.Module, input_shape: tuple[int, ...], backward: bool) -> float:
    """FLOP per image that FlopCounterMode counts for a forward (and backward) pass of a copy of model."""
    from torch.utils.flop_counter import FlopCounterMode

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not (isinstance(input_shape, tuple) and all(isinstance(d, int) and d > 0 for d in input_shape)):
        raise ValueError(f"input_shape must be a tuple of positive ints (one image, no batch), got {input_shape!r}")
    probe = copy.deepcopy(model).train()                    # the caller's model, BN stats and grads untouched
    batch = 2                                               # BatchNorm needs more than one value per channel
    device = next(probe.parameters(), torch.empty(0)).device   # the inputs go where the model is (a GPU too)
    images = torch.zeros(batch, *input_shape).to(device)    # (2, C, H, W)
    with FlopCounterMode(display=False) as counter:
        loss = F.cross_entropy(probe(images), torch.zeros(batch, dtype=torch.long).to(device))
        if backward:
            loss.backward()
    return counter.get_total_flops() / batch


def forward_flops(model: nn.Module, input_shape: tuple[int, ...] = (3, 32, 32)) -> float:
    """FLOP per image of model's forward pass: its convolutions and matmuls, 2 FLOP per multiply-add."""
    return _counted_flops(model, input_shape, backward=False)


def training_step_flops(model: nn.Module, input_shape: tuple[int, ...] = (3, 32, 32)) -> float:
    """FLOP per image of one training step (forward, loss, backward) of `model`, counted by
    torch.utils.flop_counter.FlopCounterMode on a copy of it (the model itself is not touched).

    The counter counts matmuls and convolutions (2 FLOP per multiply-add), not elementwise ops,
    BatchNorm or pooling. Backward costs about 2x forward (the gradient of each layer's input and of
    its weight), except that the first layer needs no input gradient: a bit under 3x forward in all.
    """
    return _counted_flops(model, input_shape, backward=True)


def peak_fractions(speeds: dict[str, float], flop_per_image: float, peaks: dict[str, float]) -> dict[str, float]:
    """Per variant: the FLOP/s its training step reaches (images/s x FLOP per image) over the measured
    matmul peak of the dtype it computes in (ptlab.timing.matmul_flops, in the same clock as `speeds`)."""
    if not (isinstance(flop_per_image, (int, float)) and flop_per_image > 0):
        raise ValueError(f"flop_per_image must be a positive number, got {flop_per_image!r}")
    missing = {variant_dtype(name) for name in speeds} - set(peaks)
    if missing:
        raise ValueError(f"peaks has no matmul peak for {sorted(missing)}: measure them with "
                         f"ptlab.timing.matmul_flops((torch.float32, torch.bfloat16))")
    return {name: ips * flop_per_image / peaks[variant_dtype(name)] for name, ips in speeds.items()}


def format_speed_table(speeds: dict[str, float], accuracies: dict[str, float] | None = None,
                       fractions: dict[str, float] | None = None) -> str:
    """images per CPU-second, ratio to float32, fraction of the dtype's matmul peak and accuracy per
    variant (the last two when given); measured figures left-aligned."""
    if "float32" not in speeds:
        raise ValueError(f"speeds needs a 'float32' entry to compare with, got {list(speeds)}")
    base = speeds["float32"]
    width = max(22, max(len(name) for name in speeds) + 2)
    header = f"{'variant':<{width}}{'images/CPU-s':<14}{'x float32':<12}"
    if fractions:
        header += f"{'of its matmul peak':<20}"
    if accuracies:
        header += "accuracy"
    lines = [header.rstrip()]
    for name, ips in speeds.items():
        row = f"{name:<{width}}{measured(ips, 3):<14}{measured(ips / base, 3):<12}"
        if fractions:
            row += f"{measured(fractions[name], 2) if name in fractions else '':<20}"
        if accuracies and name in accuracies:
            row += measured(accuracies[name], 3)
        lines.append(row.rstrip())
    return "\n".join(lines)


# The three kinds of bf16 kernel torch runs for a matmul or a convolution on a CPU, and the band the measured
# bf16/float32 matmul peak ratio (one thread, CPU time) falls in for each. The bands leave wide margins: measured
# on AVX-512 with BF16 about 2.4 to 4, with oneDNN capped at AVX512_CORE_VNNI (AVX-512 without BF16) about
# 0.43 to 0.54, without oneDNN's bf16 (AVX2 only) about 0.017 to 0.03.
BF16_KINDS = ("native", "emulated", "fallback")
BF16_PEAK_BANDS = {"native": (1.2, math.inf), "emulated": (0.2, 1.0), "fallback": (0.0, 0.2)}
_BAND_TEXT = {"native": "above 1.2x", "emulated": "between 0.2x and 1x", "fallback": "below 0.2x"}

# ONEDNN_MAX_CPU_ISA values that keep oneDNN below its bf16 instructions (AVX512_CORE_BF16 and up).
_CAPS_WITHOUT_BF16_INSTRUCTIONS = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                                             "AVX512_CORE_VNNI"})
_X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
_ARM = frozenset({"arm64", "aarch64"})


@dataclass(frozen=True)
class Bf16Kind:
    """Which bf16 kernels torch runs on this CPU, why, and the measured evidence.

    kind: "native" (oneDNN with the CPU's bf16 instructions), "emulated" (oneDNN without them: it converts to
    float32 inside its kernels) or "fallback" (no oneDNN bf16 here: torch's own, much slower kernels).
    reason: what torch reported that decided it. peak_ratio: the measured bf16/float32 matmul peak (None when
    not measured); `agrees` says whether it lies in the band the kind predicts (BF16_PEAK_BANDS).
    """

    kind: str
    reason: str
    peak_ratio: float | None = None

    @property
    def band(self) -> tuple[float, float]:
        """(low, high): where the bf16/float32 matmul peak ratio lies for this kind."""
        return BF16_PEAK_BANDS[self.kind]

    @property
    def agrees(self) -> bool | None:
        """Whether the measured peak ratio lies in this kind's band (None when nothing was measured)."""
        if self.peak_ratio is None:
            return None
        low, high = self.band
        return low < self.peak_ratio < high

    @property
    def expected(self) -> str:
        """The band as text, e.g. 'below 0.2x'."""
        return _BAND_TEXT[self.kind]

    def __str__(self) -> str:
        text = f"{self.kind} bf16 kernels: {self.reason}"
        if self.peak_ratio is not None:
            text += (f"; measured bf16/float32 matmul peak {measured(self.peak_ratio, 3)}x "
                     f"(expected {self.expected} for {self.kind} kernels)")
        return text


def classify_bf16_kernels(*, machine: str, onednn: bool, onednn_bf16: bool, bf16_instructions: bool,
                          arm_compute_library: bool = False, isa_cap: str = "") -> tuple[str, str]:
    """(kind, reason) from what torch reports; bf16_matmul_kind gathers these facts and measures.

    machine: platform.machine(); onednn: torch has oneDNN and it is switched on; onednn_bf16: oneDNN has bf16
    kernels for this CPU under the ISA cap (torch.ops.mkldnn._is_mkldnn_bf16_supported); bf16_instructions: the
    CPU has AVX512_BF16 or AMX (x86); arm_compute_library: torch's oneDNN uses ACL (Arm); isa_cap: the value of
    ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA), '' when unset. ATEN_CPU_CAPABILITY plays no part: it picks ATen's
    own vector kernels, not oneDNN's.
    """
    machine, cap = machine.lower(), isa_cap.strip().upper()
    capped = f" with ONEDNN_MAX_CPU_ISA={cap}" if cap else ""
    if not onednn:
        return "fallback", ("torch's oneDNN is missing or switched off (torch.backends.mkldnn), so torch's own bf16 "
                            "kernels run")
    if machine in _X86:
        if not onednn_bf16:
            return "fallback", (f"oneDNN has no bf16 kernels on this CPU{capped}, so torch's own bf16 kernels run "
                                "(oneDNN's need AVX-512, or AVX2 with AVX-NE-CONVERT)")
        if bf16_instructions and cap in _CAPS_WITHOUT_BF16_INSTRUCTIONS:
            return "emulated", (f"this CPU has bf16 instructions, but ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN below "
                                "them: its kernels convert bf16 to float32")
        if bf16_instructions:
            return "native", "oneDNN runs bf16 with this CPU's bf16 instructions (AVX512_BF16 or AMX)"
        return "emulated", ("this CPU has no bf16 instructions (AVX512_BF16 or AMX): oneDNN's kernels convert bf16 "
                            "to float32")
    if machine in _ARM:
        if onednn_bf16 and arm_compute_library:
            return "native", "oneDNN with the Arm Compute Library runs bf16 with this CPU's BF16 instructions"
        missing = "this CPU has no BF16 instructions" if not onednn_bf16 else "this torch has no Arm Compute Library"
        return "fallback", f"{missing}, so torch's own bf16 kernels run"
    return "fallback", f"on {machine or 'this machine'} torch's own bf16 kernels run"


def _bf16_facts() -> dict[str, object]:
    """What torch and the environment report about the bf16 kernels (classify_bf16_kernels' arguments)."""
    onednn = bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)
    try:
        onednn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):      # a build without the op: oneDNN's bf16 starts at AVX-512
        onednn_bf16 = onednn and bool(getattr(torch.cpu, "_is_avx512_supported", lambda: False)())
    cpu = torch.cpu
    bf16_instructions = bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
                             or getattr(cpu, "_is_amx_tile_supported", lambda: False)())
    acl = getattr(torch._C, "_has_mkldnn_acl", False)
    return {"machine": platform.machine(), "onednn": onednn, "onednn_bf16": onednn_bf16,
            "bf16_instructions": bf16_instructions, "arm_compute_library": bool(acl() if callable(acl) else acl),
            "isa_cap": os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""}


def bf16_matmul_kind(peaks: dict[str, float] | None = None, measure: bool = True) -> Bf16Kind:
    """Which bf16 kernels torch runs for matmuls and convolutions on this CPU: "native", "emulated" or "fallback".

    The kind comes from what torch reports (oneDNN's bf16 support under ONEDNN_MAX_CPU_ISA, the CPU's bf16
    instructions; ATEN_CPU_CAPABILITY does not choose these kernels). The evidence is the bf16/float32 matmul
    peak ratio: from `peaks` (ptlab.timing.matmul_flops' result) when given, else measured once on one thread
    (a few seconds on one thread) unless measure=False. `.agrees` says whether the ratio lies in the kind's band.
    """
    kind, reason = classify_bf16_kernels(**_bf16_facts())
    if peaks is None and measure:
        peaks = matmul_flops((torch.float32, torch.bfloat16), threads=1)
    ratio = peaks["bfloat16"] / peaks["float32"] if peaks is not None else None
    return Bf16Kind(kind, reason, ratio)


def native_bf16() -> bool:
    """Whether torch runs bf16 matmuls natively here (bf16_matmul_kind(measure=False).kind == "native")."""
    return bf16_matmul_kind(measure=False).kind == "native"


def _device_available(device: torch.device) -> bool:
    """Whether this machine can make tensors on device's type (the CPU always can)."""
    if device.type == "cpu":
        return True
    if device.type == "mps":
        return torch.backends.mps.is_available()
    module = getattr(torch, device.type, None)                # torch.cuda, torch.xpu, ...
    return bool(getattr(module, "is_available", lambda: False)())


def op_dtypes(device_type: str | torch.device = "cpu",
              dtype: torch.dtype = torch.bfloat16) -> list[tuple[str, str, str]]:
    """Run common ops under autocast on `device_type` and return (op, input dtype, output dtype) for each.

    The inputs and the convolution are made on that device (the same values everywhere: drawn on the
    CPU, then moved), so the table is the policy of that device's autocast. A device this machine
    does not have is a RuntimeError, never a table of some other device's policy.
    Matmul-like ops get float32 inputs (autocast casts them down); the others get a low-precision
    input, as they do in a network, where they follow a matmul or a convolution.
    """
    device = torch.device(device_type)
    if not _device_available(device):
        raise RuntimeError(f"op_dtypes({str(device_type)!r}): torch finds no {device.type} device on this machine, "
                           f"so {device.type}'s autocast policy cannot be run here; ask for a device it has "
                           f"(cpu always is)")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g).to(device)         # (8, 16) float32
    w = torch.randn(16, 16, generator=g).to(device)        # (16, 16)
    images = torch.randn(2, 3, 8, 8, generator=g).to(device)   # (2, 3, 8, 8)
    conv = nn.Conv2d(3, 4, 3).to(device)
    low = x.to(dtype)                                      # as the output of a matmul under autocast
    target = torch.randint(0, 16, (8,), generator=g).to(device)
    ops = [
        ("x @ w (matmul)", x, lambda: x @ w),
        ("F.linear", x, lambda: F.linear(x, w)),
        ("nn.Conv2d", images, lambda: conv(images)),
        ("F.cross_entropy", low, lambda: F.cross_entropy(low, target)),
        ("F.mse_loss", low, lambda: F.mse_loss(low, low)),
        ("torch.prod", low, lambda: low.prod()),
        ("torch.softmax", low, lambda: torch.softmax(low, -1)),
        ("tensor.sum", low, lambda: low.sum()),
        ("tensor.mean", low, lambda: low.mean()),
        ("torch.relu", low, lambda: torch.relu(low)),
        ("low + float32", low, lambda: low + x),
    ]
    rows = []
    with torch.autocast(device.type, dtype=dtype):
        for name, inp, fn in ops:
            rows.append((name, str(inp.dtype).replace("torch.", ""), str(fn().dtype).replace("torch.", "")))
    return rows


def format_op_table(rows: list[tuple[str, str, str]]) -> str:
    """The op table as fixed-width text."""
    lines = [f"{'op':<18}{'input':<10}output"]
    lines += [f"{op:<18}{inp:<10}{out}" for op, inp, out in rows]
    return "\n".join(lines)
