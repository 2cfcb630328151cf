"""One simulated job: N workers training a real NumPy model with a real strategy on virtual time.

Each worker is the loop of ``examples/numpy_digits.py`` (gradients, ``Worker.before_step``, the optimizer step,
``Worker.after_step``), with one line more: ``engine.compute(t)`` spends the step's compute time, drawn from
``ComputeTimes``, on the virtual clock. The real NumPy compute takes no virtual time; the messages take the time
the link model gives. Every ``eval_every`` virtual seconds the simulator, which holds every worker's model, takes
their average (the consensus model: no collective, it would change the timing) and measures its accuracy on held-
out data and the consensus distance; a last point is taken when every worker has closed.

Why each worker samples its batches from the whole training set (its own random stream) rather than from a shard
of it: at 256 workers a shard of the 1,437 training digits holds 5 of them, and the comparison would measure
over-fitting, not the strategies. Every strategy sees the same data in the same order per rank.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fast_core.config.run import RunConfig
from fast_core.data.datasets import digits, train_test_split
from fast_core.engine import Engine
from fast_core.engine.local import LocalCluster
from fast_core.model.numpy_model import MLP, SGD, FlatModel, SoftmaxRegression
from fast_core.runtime.worker import Worker
from fast_core.simulate.engine import SimCluster, SimEngine
from fast_core.simulate.links import LinkModel
from fast_core.simulate.speeds import ComputeTimes
from fast_core.strategies.spec import StrategySpec

__all__ = ["CurvePoint", "Simulation", "SimulationResult", "run_threads", "simulate"]


@dataclass
class Simulation:
    """What to simulate: the job (strategy, workers, steps, model, data) and the machine (links, compute)."""

    strategy: str = "dpsgd:ring"
    workers: int = 8
    steps: int = 200
    """Optimizer steps of every worker under a lockstep strategy; an asynchronous one shares N x steps among the
    workers, each taking the next step while any is left (as ``fast_core.Budget`` does in a real job), so a slow
    worker does fewer and does not hold the job up."""
    batch_size: int = 16
    lr: float = 0.1
    model: str = "mlp"
    """"mlp" (64-128-10, 9,610 parameters) or "softmax" (650) on scikit-learn's 8x8 digits."""
    links: LinkModel = field(default_factory=LinkModel)
    compute: ComputeTimes = field(default_factory=ComputeTimes)
    eval_every: float | None = None
    """Virtual seconds between evaluations of the consensus model (default: 20 per expected job)."""
    seed: int = 0


@dataclass
class CurvePoint:
    time: float
    """Virtual seconds since the common start."""
    accuracy: float
    """Of the consensus (averaged) model on held-out digits."""
    consensus_distance: float
    """(1/N) sum_i ||x_i - x_bar||^2."""
    mean_step: float
    """Steps done, averaged over the workers."""


@dataclass
class SimulationResult:
    setup: Simulation
    curve: list[CurvePoint]
    finish: float
    """Virtual seconds from the common start until the last worker closed: the job's time."""
    bytes_per_worker_step: float
    """Bytes each worker put on its link per step, averaged over the workers."""
    wall_seconds: float
    """How long the simulation itself took."""
    events: int

    @property
    def final_accuracy(self) -> float:
        return self.curve[-1].accuracy

    def time_to(self, accuracy: float) -> float | None:
        """First virtual time the consensus model reached ``accuracy`` (None: never)."""
        return next((point.time for point in self.curve if point.accuracy >= accuracy), None)


def _make_model(kind: str, features: int, lr: float, seed: int) -> FlatModel:
    if kind == "mlp":
        return MLP(features, 128, 10, optimizer=SGD(lr), seed=seed)
    if kind == "softmax":
        return SoftmaxRegression(features, 10, optimizer=SGD(lr), seed=seed)
    raise ValueError(f"unknown simulated model {kind!r}; use mlp or softmax")


class _Job:
    """One job's data, models and progress, shared by its workers (threads of this process) and its monitor."""

    def __init__(self, setup: Simulation) -> None:
        x, y = digits()
        self.x_train, self.y_train, self.x_test, self.y_test = train_test_split(x, y, test_fraction=0.2, seed=0)
        n = setup.workers
        self.setup = setup
        self.strategy = StrategySpec.parse(setup.strategy)  # once for the job: each worker builds its own from it
        self.models = [_make_model(setup.model, x.shape[1], setup.lr, setup.seed + rank) for rank in range(n)]
        self.steps_done = np.zeros(n, dtype=np.int64)
        self.claimed = np.zeros(n, dtype=np.int64)
        self.budget = setup.steps * n  # asynchronous strategies share it: a faster worker takes more of it
        self.ends = np.zeros(n)
        self.finished = np.zeros(n, dtype=bool)
        self.curve: list[CurvePoint] = []
        self.bytes_sent = np.zeros(n)
        self.compute = dataclasses.replace(setup.compute)  # fresh random streams: each run draws the same times
        self.every = setup.eval_every or setup.steps * setup.compute.step_seconds / 40

    def evaluate(self, at: float) -> None:
        params = np.stack([model.params() for model in self.models])
        mean = params.mean(axis=0)
        spread = float(np.mean(np.sum((params - mean) ** 2, axis=1)))
        accuracy = self.models[0].accuracy(self.x_test, self.y_test, mean)
        self.curve.append(CurvePoint(at, accuracy, spread, float(self.steps_done.mean())))

    def train(self, engine: Engine, compute: Callable[[float], None], clock: Callable[[], float]) -> None:
        """One worker: the loop of examples/numpy_digits.py, with ``compute`` spending each step's compute time."""
        setup, rank = self.setup, engine.rank
        model = self.models[rank]
        rng = np.random.default_rng([setup.seed, rank, 11])
        config = RunConfig()  # never the launcher's environment: no run folder, straggler or budget of a real job
        worker = Worker(model, self.strategy, engine, config=config).start()
        lockstep = worker.strategy.lockstep
        while self.steps_done[rank] < setup.steps if lockstep else self.claimed.sum() < self.budget:
            self.claimed[rank] += 1
            chosen = rng.integers(0, len(self.y_train), setup.batch_size)
            model.compute_gradients(self.x_train[chosen], self.y_train[chosen])
            compute(self.compute.draw(rank))
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
            self.steps_done[rank] += 1
        worker.close()
        self.ends[rank] = clock()
        self.finished[rank] = True
        self.bytes_sent[rank] = worker.metrics.bytes_sent

    def result(self, finish: float, started: float, events: int) -> SimulationResult:
        return SimulationResult(
            setup=self.setup,
            curve=self.curve,
            finish=finish,
            bytes_per_worker_step=float(self.bytes_sent.sum() / max(1, self.steps_done.sum())),
            wall_seconds=time.perf_counter() - started,
            events=events,
        )


def simulate(setup: Simulation) -> SimulationResult:
    """Run the job on virtual time; deterministic for ``setup.seed``."""
    job = _Job(setup)
    cluster = SimCluster(setup.workers, setup.links)

    def monitor() -> None:
        if not job.finished.all():
            job.evaluate(cluster.now)
            cluster.scheduler.at(cluster.now + job.every, monitor)

    def worker_loop(engine: SimEngine) -> None:
        if engine.rank == 0:
            cluster.scheduler.at(cluster.now, monitor)
        job.train(engine, engine.compute, lambda: cluster.now)

    started = time.perf_counter()
    cluster.run(worker_loop)
    finish = float(job.ends.max())
    job.evaluate(finish)
    return job.result(finish, started, cluster.scheduler.events)


def run_threads(setup: Simulation) -> SimulationResult:
    """The same job on real threads and the wall clock (LocalCluster; compute times slept, ``setup.links`` unused:
    messages take what in-process copies take): what the simulator is checked against."""
    job = _Job(setup)
    origin = time.monotonic()
    clock = lambda: time.monotonic() - origin  # noqa: E731 - one expression, named for reading
    stop = threading.Event()

    def monitor() -> None:
        while not stop.wait(job.every):
            job.evaluate(clock())

    watcher = threading.Thread(target=monitor, daemon=True)
    started = time.perf_counter()
    job.evaluate(0.0)
    watcher.start()
    try:
        LocalCluster(setup.workers, timeout=120).run(lambda engine: job.train(engine, time.sleep, clock))
    finally:
        stop.set()
        watcher.join()
    finish = float(job.ends.max())
    job.evaluate(finish)
    return job.result(finish, started, 0)
