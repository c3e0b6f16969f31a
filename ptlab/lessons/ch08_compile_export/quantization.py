"""Chapter 8's dynamic int8 quantization, measured with the deprecated torch.ao API that this torch still ships."""
from __future__ import annotations

import warnings

import torch
from torch import nn


def legacy_dynamic_int8(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """Linear layers quantized to int8 with torch.ao's deprecated quantize_dynamic, and the warnings it raised.

    Kept to *measure* what dynamic int8 quantization does in this torch version; new code uses torchao's
    `quantize_(model, Int8DynamicActivationInt8WeightConfig())` instead (not installed with the course).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    messages = list(dict.fromkeys(f"{w.category.__name__}: {str(w.message).strip()}" for w in caught))
    return quantized, messages
