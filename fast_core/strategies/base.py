"""What every strategy is, and all it may touch: hooks around the optimizer step, given a narrow StepContext.

A strategy never sees the Worker. Its hooks get a ``StepContext``: the (metered) engine, the model through the
adapter contract, the layout, this rank and the job size, the metrics, and two clocks: ``step``, the worker's global
step (the same on every rank; message stamps and staleness use it), and ``round``, how many mixing rounds this
strategy has done (time-varying topologies are indexed by it). The two agree unless a wrapper such as ``Every``
runs the strategy on some steps only; then ``round`` still counts 0, 1, 2, ... so a one-peer exponential graph
cycles through all its peers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fast_core.errors import ConfigError
from fast_core.topology import make_topology
from fast_core.topology.heal import heal

if TYPE_CHECKING:
    from fast_core.engine import Engine
    from fast_core.metrics import Metrics
    from fast_core.model.contract import ModelAdapter
    from fast_core.model.flat import FlatLayout
    from fast_core.strategies.cost import CostProfile


class StepContext:
    """What a strategy's hooks may use. The Worker owns one and advances its clocks; wrappers make children."""

    def __init__(self, engine: Engine, model: ModelAdapter, metrics: Metrics) -> None:
        self.engine = engine
        """Messages, collectives and waits; metered, so the strategy counts nothing by hand."""
        self.model = model
        self.metrics = metrics
        self.round = 0
        self._step = 0

    @property
    def rank(self) -> int:
        """This rank's number in the group (it changes when a fault-tolerant job loses a rank:
        ``FaultTolerant.shrink``)."""
        return self.engine.rank

    @property
    def size(self) -> int:
        """The number of ranks in the group (it shrinks with the group)."""
        return self.engine.size

    @property
    def layout(self) -> FlatLayout:
        return self.model.layout

    @property
    def step(self) -> int:
        """The worker's global step: 0 before the first optimizer step, then one more after each."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = value

    def child(self) -> StepContext:
        """A context with the same step and resources but its own round counter (for ``Every``'s inner strategy)."""
        return _ChildContext(self)


class _ChildContext(StepContext):
    """Shares its parent's step; counts its own rounds."""

    def __init__(self, parent: StepContext) -> None:
        super().__init__(parent.engine, parent.model, parent.metrics)
        self._parent = parent
        self.round = parent.round  # a strategy set up at step s (after a Schedule switch) starts at round s

    @property
    def step(self) -> int:
        return self._parent.step

    @step.setter
    def step(self, value: int) -> None:
        raise AttributeError("a child context follows its parent's step")


@dataclass(frozen=True)
class GroupChange:
    """How the group changed when a fault-tolerant job lost ranks (``FaultTolerant.shrink``)."""

    kept: tuple[int, ...]
    """The survivors' ranks in the group before, in their new order (survivor ``i`` was rank ``kept[i]``)."""
    old_size: int
    lost: tuple[int, ...]
    """The lost ranks' launch numbers (``FaultTolerant.world_ranks``)."""
    size: int = 0
    """The group's size after the change."""
    replaced: tuple[int, ...] = ()
    """Lost ranks' launch numbers that new processes took over (``fast run --max-restarts``)."""

    first_step: int = 0
    """The step the group's training started (or resumed) from."""
    added: tuple[int, ...] = ()
    """New launch numbers, taken by workers that asked to join (``fast run --join``)."""

    @property
    def newcomers(self) -> tuple[int, ...]:
        """Every launch number a new process took (``FaultTolerant.grow``): the group is numbered by launch number
        again and the topology is the one the job was launched with, built for the new size."""
        return self.replaced + self.added

    def then(self, later: GroupChange) -> GroupChange:
        """This change followed by ``later`` (a rank lost during the recovery from another), as one change."""
        return GroupChange(
            tuple(self.kept[i] for i in later.kept) if not later.newcomers else later.kept,
            self.old_size,
            self.lost + later.lost,
            later.size,
            tuple(sorted(set(self.replaced + later.replaced))),
            self.first_step,
            tuple(sorted(set(self.added + later.added))),
        )


def _buildable(topology: object, size: int) -> bool:
    try:
        make_topology(topology, size)
    except (ConfigError, ValueError):
        return False
    return True


class Strategy:
    """Base class of all strategies; hooks default to doing nothing.

    ``setup`` runs once all ranks hold the same parameters; ``before_step`` sees the gradients of the last
    backward pass before the user's optimizer uses them; ``after_step`` sees the parameters the optimizer left;
    ``close`` completes any communication still in flight.

    Two facts a strategy declares rather than leaves to be guessed: ``lockstep`` (every rank takes part in every
    step, so a rank out of data must keep joining in; False for asynchronous strategies) and ``uses_gradients``
    (it reads or replaces gradients, so an adapter must expose them and apply one through the user's optimizer).
    """

    name = "strategy"
    lockstep: bool = True
    uses_gradients: bool = False
    rank_options: tuple[str, ...] = ()
    """Options each rank may set for itself (an asynchronous strategy's seed of its own random choices): the
    start-up check that all ranks run the same strategy leaves them out."""

    def lockstep_steps(self) -> float:
        """How many steps from this strategy's start every rank runs in lockstep (a shared budget counts those
        without messages and shares a counter after them): ``inf`` when lockstep, 0 when asynchronous."""
        return math.inf if self.lockstep else 0

    def setup(self, ctx: StepContext) -> None:
        """Allocate buffers and start whatever communication precedes the first step."""

    def before_step(self, ctx: StepContext) -> None:
        """Act on the gradients (gradient strategies)."""

    def after_step(self, ctx: StepContext) -> None:
        """Act on the parameters (parameter strategies)."""

    def end_epoch(self, ctx: StepContext, metric: float) -> None:
        """React to the end of an epoch with this worker's validation metric (e.g. FAST's best-replica restart)."""

    def close(self, ctx: StepContext) -> None:
        """Complete pending communication."""

    def reset(self, ctx: StepContext) -> None:
        """The parameters were replaced (a checkpoint was loaded, ``ctx.step`` set to its step): forget what was
        sent or mixed from the old ones (collective). Asynchronous strategies drop what is in flight and re-post."""

    survivable: bool = True
    """Whether the strategy can go on over the survivors when a rank is lost (a fault-tolerant engine). One that
    cannot says so (False) and the job ends with the PeerLost error."""

    needs_equal_start: bool = False
    """Whether the replicas must start from the same parameters (the Worker's start broadcast): a strategy whose
    state assumes it says True, and ``Worker(..., broadcast_start=False)`` is refused with it, since the replicas
    would otherwise never meet."""

    def abandon(self, ctx: StepContext) -> None:
        """A rank was lost: stop communication threads and forget requests at once, without any collective (the
        group's communicators are revoked; ``rejoin`` follows over the survivors)."""

    def rejoin(self, ctx: StepContext, change: GroupChange) -> None:
        """The group shrank to the survivors (``ctx.rank``/``ctx.size`` are the new ones) and the Worker left every
        survivor at the same parameters (their average) and step. Collective: set up again over the survivors, on
        the topology healed around the lost ranks (``heal_topology``)."""
        self.heal_topology(change)
        self.setup(ctx)

    def heal_topology(self, change: GroupChange) -> None:
        """Replace this strategy's topology by the one over the survivors (``fast_core.topology.heal``: the lost
        ranks' neighbours are joined, weights renormalised); also for a strategy not set up yet (a later phase of
        a Schedule). When new processes joined the group (``change.newcomers``), the topology the job was launched
        with, built for the group's size. Nothing for strategies without a topology."""
        launch = self.__dict__.setdefault("_launch_topology", getattr(self, "topology", None))
        if launch is None:
            return
        if change.newcomers:  # a ring where the launch topology has no form for this size (a torus of 7)
            self.topology = launch if _buildable(launch, change.size) else "ring"
            return
        built = getattr(self, "_graph", None)
        if built is None:
            built = make_topology(self.topology, change.old_size, weights=getattr(self, "weights", "uniform"))
        self.topology = heal(built, change.kept)

    def cost_profile(self, size: int) -> CostProfile | None:
        """What one step sends on ``size`` ranks, for ``fast model`` (``fast_core.strategies.cost``); None: this
        strategy has no model there yet."""
        return None

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"
