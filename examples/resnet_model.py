"""ResNet-18 and ResNet-50 (He et al. 2016) at ImageNet layout, built here in plain PyTorch.

Built in the example rather than taken from torchvision, whose wheel does not import against every CPU build of
torch. The layout is torchvision's: a 7x7 stride-2 stem and max-pool, four stages of basic (18) or bottleneck (50)
blocks with widths 64-512 (x4 for bottlenecks), the stride on each stage's first 3x3 convolution, a projection
shortcut where the shape changes, global average pooling and a 1000-way classifier; 11.7M and 25.6M parameters.
"""

from __future__ import annotations

import torch
from torch import nn

LAYOUTS = {"resnet18": ("basic", (2, 2, 2, 2)), "resnet50": ("bottleneck", (3, 4, 6, 3))}


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]


class Residual(nn.Module):
    """One block: ``body(x) + shortcut(x)``, then ReLU."""

    def __init__(self, kind: str, cin: int, width: int, stride: int) -> None:
        super().__init__()
        if kind == "basic":
            cout = width
            layers = [*_conv_bn(cin, width, 3, stride), nn.ReLU(inplace=True), *_conv_bn(width, width, 3)]
        else:
            cout = 4 * width
            layers = [
                *_conv_bn(cin, width, 1),
                nn.ReLU(inplace=True),
                *_conv_bn(width, width, 3, stride),
                nn.ReLU(inplace=True),
                *_conv_bn(width, cout, 1),
            ]
        nn.init.zeros_(layers[-1].weight)  # each block starts as the identity: stable from the first step
        self.body = nn.Sequential(*layers)
        self.shortcut = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else nn.Identity()
        self.out_channels = cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def build_resnet(arch: str = "resnet50", classes: int = 1000, seed: int = 0) -> nn.Module:
    if arch not in LAYOUTS:
        raise ValueError(f"arch {arch}: one of {', '.join(LAYOUTS)}")
    torch.manual_seed(seed)
    kind, depths = LAYOUTS[arch]
    layers: list[nn.Module] = [*_conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    channels = 64
    for stage, depth in enumerate(depths):
        for index in range(depth):
            block = Residual(kind, channels, 64 * 2**stage, 2 if index == 0 and stage > 0 else 1)
            layers.append(block)
            channels = block.out_channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


def synthetic_batch(batch: int, image_size: int, classes: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """ImageNet-shaped random images (batch, 3, size, size) and labels: for step time and memory, not accuracy."""
    images = torch.randn(batch, 3, image_size, image_size, generator=generator)
    return images, torch.randint(0, classes, (batch,), generator=generator)
