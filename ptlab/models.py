"""Models the course trains: one small CNN, fast enough for a CPU and big enough to overfit."""
from __future__ import annotations

import torch
from torch import nn


def conv_bn_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    """A 3x3 convolution (same size), BatchNorm and ReLU; the conv has no bias because BN adds one."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU stages with max pooling, global average pooling and a linear head."""

    def __init__(self, num_classes: int = 10, width: int = 32, in_channels: int = 3) -> None:
        super().__init__()
        for name, value in (("num_classes", num_classes), ("width", width), ("in_channels", in_channels)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        w = width
        self.features = nn.Sequential(
            conv_bn_relu(in_channels, w),   # (B, w, 32, 32)
            nn.MaxPool2d(2),                # (B, w, 16, 16)
            conv_bn_relu(w, 2 * w),         # (B, 2w, 16, 16)
            nn.MaxPool2d(2),                # (B, 2w, 8, 8)
            conv_bn_relu(2 * w, 4 * w),     # (B, 4w, 8, 8)
            nn.MaxPool2d(2),                # (B, 4w, 4, 4)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)  # (B, 4w, 1, 1): any input size works
        self.head = nn.Linear(4 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) for images (B, C, H, W)."""
        x = self.features(x)                # (B, 4w, H/8, W/8)
        x = self.pool(x).flatten(1)         # (B, 4w)
        return self.head(x)                 # (B, num_classes)


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) parameters in a model."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
