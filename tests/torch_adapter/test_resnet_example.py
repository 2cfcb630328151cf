"""The ResNet example (fast_examples.torch_resnet): torchvision's parameter counts, and a real 2-rank job at a small
image size that reports step time, memory and the consensus model's loss. No assertion is on an absolute time."""

from __future__ import annotations

import re

import pytest
import torch
from mpirun import run_mpi

from fast_examples import torch_resnet
from fast_examples.resnet_model import build_resnet


@pytest.mark.parametrize(("arch", "count"), [("resnet18", 11_689_512), ("resnet50", 25_557_032)])
def test_the_resnets_have_torchvisions_parameter_counts(arch: str, count: int) -> None:
    with torch.device("meta"):
        model = build_resnet(arch)
    assert sum(p.numel() for p in model.parameters()) == count


def test_a_resnet50_maps_an_imagenet_batch_to_1000_logits() -> None:
    model = build_resnet("resnet50").eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


@pytest.mark.mpi
def test_two_ranks_train_resnet18_and_report_step_time_and_memory() -> None:
    args = ("--arch", "resnet18", "--image-size", "64", "--steps", "4", "--batch-size", "2", "--strategy", "allreduce")
    output = run_mpi(2, torch_resnet.__file__, *args, timeout=240)
    found = re.search(
        r"median step (\d+) ms .* model (\d+) MiB; peak resident memory per rank (\d+), (\d+) MiB; "
        r"consensus model's loss on a fixed batch ([0-9.]+)",
        output,
    )
    assert found is not None, output
    model_mib, peaks = int(found.group(2)), [int(found.group(3)), int(found.group(4))]
    assert model_mib == round(11_689_512 * 4 / 2**20)
    assert all(peak > 2 * model_mib for peak in peaks)  # the model and its gradients at least
    assert 0 < float(found.group(5)) < 20
