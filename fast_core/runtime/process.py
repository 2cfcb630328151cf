"""This process's engine, made once and shared by every caller: ``fast_core.init()``, ``fast_torch.init()``,
``fast_tf.init()`` and ``fast_jax.init()`` all return it (MPI under an MPI launcher, else one local worker), made
from the numbers of this process's run configuration (``fast_core.run_config()``, read once)."""

from __future__ import annotations

import hashlib
import socket
import threading

import numpy as np

from fast_core.config.current import run_config
from fast_core.config.run import check_timeout
from fast_core.config.slurm import step_placement
from fast_core.engine import Engine, default_engine
from fast_core.engine.collectives import JOB
from fast_core.runtime import startup, uncaught
from fast_core.runtime.heartbeat import start_heartbeat

_lock = threading.Lock()
_engine: Engine | None = None


def init(timeout: float | None = None) -> Engine:
    """Start FAST for this process and return its engine; later calls return the same one. The engine is made from
    the run configuration (``run_config()``: its timeout, fault tolerance and restarts); ``timeout``, the seconds
    any wait on a peer may last, replaces the configuration's and counts only on the first call. A new engine on
    each call is ``fast_core.engine.default_engine``."""
    global _engine
    with _lock:
        if _engine is None:
            config = run_config()
            marked = config.run_dir is not None and config.fault_tolerant  # a loss before MPI runs is told apart
            if marked:
                startup.mark_starting(config.run_dir)
            _engine = default_engine(
                timeout=config.timeout if timeout is None else check_timeout(timeout),
                fault_tolerant=config.fault_tolerant,
                max_restarts=config.max_restarts,
                max_ranks=config.max_ranks,
            )
            if marked:
                startup.mark_started(config.run_dir)
            if config.heartbeat_fd is not None:  # under a guard that watches for a freeze
                start_heartbeat(config.heartbeat_fd)
            if config.run_dir is not None:  # under fast run: an uncaught error reaches its closing line
                uncaught.install(config.run_dir, _engine.rank)
        return _engine


def rank() -> int:
    """This process's rank (0 .. size - 1; 0 without a launcher)."""
    return init().rank


def size() -> int:
    """The number of workers training together (1 without a launcher)."""
    return init().size


def local_rank() -> int:
    """This process's rank among the workers on its host (0 .. local_size() - 1): e.g. the GPU it takes."""
    return _placement()[0]


def local_size() -> int:
    """The number of workers on this process's host."""
    return _placement()[1]


_placements: dict[int, tuple[int, int]] = {}


def _placement() -> tuple[int, int]:
    engine = init()
    with _lock:
        known = _placements.get(id(engine))
    if known is None:  # srun said it (no collective), else the ranks compare their hosts
        known = step_placement(engine.rank, engine.size) or host_placement(engine)
        with _lock:
            _placements[id(engine)] = known
    return known


def host_placement(engine: Engine, host: str | None = None) -> tuple[int, int]:
    """(local rank, local size) of ``engine``'s rank among the ranks on its host (collective: one allreduce of a
    digest of each rank's host name, ``host`` or this machine's; ranks of one host are numbered in rank order)."""
    digests = np.zeros(engine.size, dtype=np.int64)
    name = (socket.gethostname() if host is None else host).encode()
    digests[engine.rank] = int.from_bytes(hashlib.blake2b(name, digest_size=7).digest(), "big")
    engine.allreduce(digests, kind=JOB)
    mine = digests[engine.rank]
    return int(np.count_nonzero(digests[: engine.rank] == mine)), int(np.count_nonzero(digests == mine))
