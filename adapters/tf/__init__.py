"""fast_tf: run any fast_core strategy inside Keras 3's model.fit, on the TensorFlow, JAX or torch backend.

import fast_tf as fast
fast.init()
x, y = fast.shard(x, y)                          # this rank's part of the data
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss=..., metrics=[...])
model.fit(x, y, callbacks=[fast.Callback("async:torus")], verbose=1 if fast.rank() == 0 else 0)

Gradient strategies (all-reduce, FAST) compile with ``fast.DistributedOptimizer(optimizer)``, which parameter
strategies accept too (same numbers as the plain optimizer), so one script serves every strategy. Under a shared work
budget (``fast.Callback(..., batch_size=32, budget=fast_core.Budget(samples=N))``) feed full batches endlessly
with ``fast.Batches(x, y, batch_size=32)`` and give ``fit`` enough epochs: every rank stops once it is spent.
``fast.save_checkpoint(path, callback)`` after fit saves the job; ``fast.Callback(..., resume_from=path)`` resumes it.
``fast.average(value)``, ``fast.sum(value)`` and ``fast.broadcast(value, root=0)`` reduce a metric, a tensor, a number
or a list/tuple/dict of them over all ranks (each value back in its own dtype and shape), e.g. a validation loss.
``fast.consensus_model(model)`` mid-training is a copy of the model holding the mean over ranks (collective).
"""

from __future__ import annotations

try:
    import keras
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError("fast_tf needs Keras 3 and a backend: pip install 'fast-training[tf]'") from exc
if int(keras.__version__.split(".")[0]) < 3:  # pragma: no cover - tf.keras 2 has another callback API
    raise ImportError(f"fast_tf needs Keras 3, found keras {keras.__version__}: pip install 'keras>=3'")

from fast_core.engine.collectives import average_logs
from fast_core.runtime.process import init, rank, size

from .callback import Callback
from .checkpoint import save_checkpoint
from .collectives import average, broadcast, sum  # noqa: A004 - torch.distributed's and Horovod's names
from .data import Batches, shard
from .model import KerasModel
from .optimizer import DistributedOptimizer
from .variables import (
    average_variables,
    broadcast_variables,
    consensus_model,
    consensus_weights,
    layout_of,
    read_flat,
    write_flat,
)

__all__ = [
    "Batches",
    "Callback",
    "DistributedOptimizer",
    "KerasModel",
    "average",
    "average_logs",
    "average_variables",
    "broadcast",
    "broadcast_variables",
    "consensus_model",
    "consensus_weights",
    "init",
    "layout_of",
    "rank",
    "read_flat",
    "save_checkpoint",
    "shard",
    "size",
    "sum",
    "write_flat",
]
