"""fast_torch: run any fast_core strategy on a PyTorch model, with the API Horovod users know.

import fast_torch as fast
fast.init()
opt = fast.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, strategy="async:torus")
... loss.backward(); opt.step() ...
fast.average_model(model)
val_loss = fast.average(torch.tensor(loss))     # any tensor, number, list or dict: fast.sum, fast.broadcast too
fast.save_checkpoint("job.ckpt", model, opt)  # and fast.load_checkpoint(...) to resume, on any number of ranks
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError("fast_torch needs PyTorch: pip install 'fast-training[torch]'") from exc

from fast_core.runtime.process import init, rank, size

from .api import average_model, broadcast_parameters, consensus_copy, join, shard
from .checkpoint import load_checkpoint, save_checkpoint
from .collectives import average, broadcast, sum  # noqa: A004 - torch.distributed's and Horovod's names
from .decoupled import DecoupledTrainer
from .layers import model_layers
from .model import TorchModel
from .optimizer import DistributedOptimizer, worker_of

__all__ = [
    "DecoupledTrainer",
    "DistributedOptimizer",
    "TorchModel",
    "average",
    "average_model",
    "broadcast",
    "broadcast_parameters",
    "consensus_copy",
    "init",
    "join",
    "load_checkpoint",
    "model_layers",
    "rank",
    "save_checkpoint",
    "shard",
    "size",
    "sum",
    "worker_of",
]
