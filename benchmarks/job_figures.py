"""Job figures for the MPI benchmarks, as `fast bench` reports them (fast_core/cli/summary.py).

A figure describes the job a user waits for. Its wall-clock runs from the earliest rank's start (read right after
the worker's collective start and a barrier: the common start) to the last rank's stop (the end of its last step);
its samples/s divides all ranks' samples by that wall-clock. A rank's own rate (its samples over its own time) is
kept apart, named per-rank: a sum of those is no throughput any clock sees. Accuracy over time is the consensus
model's: every rank keeps in memory a copy of its parameters at fixed points since its start, and after the run the
ranks average each point (one allreduce per point, nothing during training, so no rank waits for another) and rank 0
evaluates the averages; the curve ends with the final consensus model at the job's stop.

    span = RankSpan(params=lambda: flat_parameters, every_s=0.1)
    span.start()                        # after worker.start() and a barrier
    while (n := worker.claim_batch(batch)) > 0:
        ...one step...
        span.step_end()
    job = gather_job(comm, span, samples, steps, final_params, evaluate)   # collective; a Job on rank 0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI
from report import gather_to_root

Evaluate = Callable[[np.ndarray], float]
"""Flat parameters -> a score, higher is better (test accuracy)."""


class RankSpan:
    """One rank's start and stop, and, with ``every_s``, copies of its parameters at ``every_s``, ``2 * every_s``,
    ... seconds since its start: each the parameters at the first step end at or after that point."""

    def __init__(self, params: Callable[[], np.ndarray] | None = None, every_s: float | None = None) -> None:
        if every_s is not None and not every_s > 0:
            raise ValueError(f"RankSpan(every_s={every_s}): give the seconds between snapshots, > 0, or None")
        if every_s is not None and params is None:
            raise ValueError("RankSpan(every_s=...) needs params=, the function that returns the flat parameters")
        self.params = params
        self.every = every_s
        self.snapshots: list[np.ndarray] = []
        self.wall_start = self.wall_stop = 0.0  # time.time(): comparable between the ranks of one machine
        self.seconds = 0.0  # this rank's own time, its start to its last step's end
        self._origin = 0.0

    def start(self) -> None:
        """Call once the worker has started and the ranks passed a barrier: the common start."""
        self._origin = time.perf_counter()
        self.wall_start = self.wall_stop = time.time()

    def step_end(self) -> None:
        """Call at the end of every step: it is this rank's stop until another step ends."""
        self.seconds = time.perf_counter() - self._origin
        self.wall_stop = time.time()
        if self.every is None:
            return
        due = int(self.seconds // self.every)  # points 1 .. due reached
        if due > len(self.snapshots):
            copy = np.array(self.params(), copy=True)
            self.snapshots.extend([copy] * (due - len(self.snapshots)))


@dataclass
class Job:
    """One run seen from rank 0."""

    wall: float  # seconds from the earliest rank's start to the last rank's stop
    samples: int  # trained by all ranks
    seconds: np.ndarray  # per rank: its own time, its start to its stop
    rank_samples: np.ndarray  # per rank
    steps: list[int]  # per rank
    extra: np.ndarray  # per rank: the benchmark's own numbers (ranks x k)
    final_accuracy: float  # the consensus model's at the end
    times: np.ndarray = field(default_factory=lambda: np.zeros(0))  # curve: seconds since the common start
    accuracy: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the consensus model's at those times
    distance: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (1/N) sum ||x_i - mean||^2, snapshot points

    @property
    def samples_per_second(self) -> float:
        """The job's: all samples over the job's wall-clock."""
        return self.samples / self.wall if self.wall > 0 else 0.0

    def per_rank(self, numbers: np.ndarray, ranks: Sequence[int] | None = None) -> float:
        """Mean over ``ranks`` (default: all) of ``numbers`` per second of each rank's own time (a per-rank rate)."""
        chosen = range(len(self.seconds)) if ranks is None else ranks
        return float(np.mean([numbers[r] / self.seconds[r] if self.seconds[r] > 0 else 0.0 for r in chosen]))

    def time_to(self, target: float) -> float | None:
        """Seconds since the common start at which the consensus model first reached ``target``; None: never."""
        reached = np.flatnonzero(self.accuracy >= target)
        return float(self.times[reached[0]]) if reached.size else None


def gather_job(
    comm: MPI.Comm,
    span: RankSpan,
    samples: int,
    steps: int,
    final: np.ndarray,
    evaluate: Evaluate,
    extra: Sequence[float] = (),
) -> Job | None:
    """Collective, after training and the final average: every rank's figures (numbers, never a pickle) and the
    consensus curve, as a Job on rank 0 (None elsewhere). ``final``: the consensus model's flat parameters."""
    table = gather_to_root(comm, [span.wall_start, span.wall_stop, span.seconds, samples, steps, *extra])
    points, distance = _consensus_points(comm, span)
    if comm.Get_rank() != 0:
        return None
    wall = float(table[:, 1].max() - table[:, 0].min())
    final_accuracy = float(evaluate(final))
    times = np.append((np.arange(len(points)) + 1) * (span.every or 0.0), wall)
    accuracy = np.append([evaluate(p) for p in points], final_accuracy)
    return Job(
        wall=wall,
        samples=int(table[:, 3].sum()),
        seconds=table[:, 2],
        rank_samples=table[:, 3],
        steps=[int(s) for s in table[:, 4]],
        extra=table[:, 5:],
        final_accuracy=final_accuracy,
        times=times,
        accuracy=accuracy,
        distance=distance,
    )


def _consensus_points(comm: MPI.Comm, span: RankSpan) -> tuple[list[np.ndarray], np.ndarray]:
    """(on rank 0: the mean of the ranks' snapshots at every point all reached, in their dtype; every rank: the
    consensus distance at those points). One float64 allreduce per point."""
    count = np.array([len(span.snapshots)], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, count, op=MPI.MIN)
    size = comm.Get_size()
    means, mine = [], np.zeros(int(count[0]))
    for k, snapshot in enumerate(span.snapshots[: int(count[0])]):
        mean = snapshot.astype(np.float64)
        comm.Allreduce(MPI.IN_PLACE, mean)
        mean /= size
        mine[k] = float(((snapshot - mean) ** 2).sum())
        if comm.Get_rank() == 0:
            means.append(mean.astype(snapshot.dtype))
    distance = np.zeros_like(mine)
    comm.Allreduce(mine, distance)
    return means, distance / size
