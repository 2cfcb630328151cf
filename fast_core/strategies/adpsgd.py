"""AD-PSGD (Lian et al. 2018): asynchronous pairwise averaging with one neighbour at a time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fast_core.compression import parameter_codec
from fast_core.errors import ConfigError
from fast_core.model.mixing import axpy
from fast_core.strategies.base import Strategy
from fast_core.strategies.checks import static_topology
from fast_core.strategies.cost import CostProfile
from fast_core.strategies.integrity import check_own, refused
from fast_core.strategies.registry import registered
from fast_core.topology import Topology
from fast_core.transport.service import RequestService

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


@registered
class ADPSGD(Strategy):
    """Each step a worker averages with one random neighbour: x_i, x_j <- (x_i + x_j) / 2, one pair at a time.

    Pairs are formed by the communication threads, never by the trainers, so no wait cycle (deadlock) can form
    on any topology and the trainer never blocks. Each rank's thread keeps a snapshot s of its parameters: the
    active rank sends s_i, the passive one answers with s_j and both move their snapshots to (s_i + s_j) / 2,
    recording the same change as a correction the trainer adds at its next step (so its own updates in between
    are kept and gradients see possibly stale parameters, as in the paper). Both changes cancel, so the average
    of all workers is preserved exactly. When two ranks ask each other at the same moment, only the request of
    the lower rank is averaged (the other is answered with its own value, a no-op): otherwise they would swap
    values instead of averaging them.

    ``compress``: the codec the snapshots travel in ("fp16", "bf16", "int8"; ``fast_core.compression``). Both
    ranks of a pair then move by half the difference of the two decoded snapshots, in opposite directions, so the
    average of all workers stays exact; the rounding only changes where the pair meets.
    """

    name = "adpsgd"
    lockstep = False
    rank_options = ("seed",)  # each rank draws its own partners from (seed, rank) anyway

    def __init__(self, topology: str | Topology = "torus", seed: int = 0, compress: str | None = "none") -> None:
        self.topology = topology
        self.seed = seed
        self.compress = "none" if compress is None else str(compress)  # a strategy string's none: None
        self._codec = parameter_codec(compress, "adpsgd")

    def cost_profile(self, size: int) -> CostProfile:
        """One model to one peer and its reply averaged in, from a communication thread."""
        return CostProfile(rounds=1, models_per_round=1, timing="background", mixing_copies=3)

    def setup(self, ctx: StepContext) -> None:
        graph = static_topology(self.topology, ctx.size, "uniform", "AD-PSGD")
        if not graph.is_undirected():
            raise ConfigError(f"AD-PSGD averages in pairs, so it needs an undirected topology; {graph!r} is directed")
        self._graph = graph  # healed when a rank is lost
        self._rank = ctx.rank
        self._ctx = ctx  # the service thread counts refusals into its metrics
        self._neighbors = graph.out_neighbors(ctx.rank)
        self._rng = np.random.default_rng((self.seed, ctx.rank))
        self._snapshot = np.array(ctx.model.params(), copy=True)  # this rank's value as pairs see it
        self._correction = np.zeros_like(self._snapshot)  # pair averages not yet applied by the trainer
        self._service = RequestService(
            ctx.engine,
            self._neighbors,
            ctx.layout.size,
            ctx.layout.dtype,
            self._answer,
            codec=self._codec,
            on_reply=self._take_reply,
            name="adpsgd",
            start=False,  # _answer reads self._service: start once it is assigned
        )
        self._service.start()

    def _move_halfway(self, other: np.ndarray, mine: np.ndarray) -> None:
        """snapshot, correction += (other - mine) / 2, ``mine`` being our value as the peer read it and ``other``
        the peer's as we read it: the peer moves by the opposite (service thread, under the service lock)."""
        for into in (self._correction, self._snapshot):
            axpy(0.5, other, into)
            axpy(-0.5, mine, into)

    def _answer(self, peer: int, theirs: np.ndarray, reply: np.ndarray) -> None:
        if self._service.outstanding_to(peer) and self._rank < peer:
            np.copyto(reply, theirs)  # crossed requests: ours is the one averaged; theirs becomes a no-op
            return
        np.copyto(reply, self._snapshot)
        if not refused(self._ctx, peer, theirs):  # NaN/Inf: answered, but our snapshot does not move
            self._move_halfway(theirs, self._service.as_received(reply))

    def _take_reply(self, peer: int, theirs: np.ndarray) -> None:
        asked = self._service.request_payload
        if refused(self._ctx, peer, theirs):  # NaN/Inf: this pair changes nothing here
            return
        if not np.array_equal(theirs, asked):  # a no-op answer (crossed requests) changes nothing
            # move by what the pair average (asked + theirs) / 2 changes, whatever our snapshot did meanwhile
            self._move_halfway(theirs, asked)

    def _settle(self, ctx: StepContext) -> np.ndarray:
        """Add the pair averages done since the last step; publish the result as our snapshot."""
        params = ctx.model.params()
        with self._service.lock:
            params += self._correction
            self._correction.fill(0.0)
            np.copyto(self._snapshot, params)
        ctx.model.set_params(params)
        return params

    def after_step(self, ctx: StepContext) -> None:
        check_own(ctx, ctx.model.params())  # before it becomes the snapshot peers average with
        params = self._settle(ctx)
        if self._neighbors and self._service.pending is None:  # never wait: skip a turn while a pair is open
            self._service.ask(int(self._rng.choice(self._neighbors)), params)

    def reset(self, ctx: StepContext) -> None:
        """Collective: every pair request is answered (``close``), and the pair averages not yet applied are dropped
        with the old snapshot: both came from the parameters a checkpoint replaced."""
        self._service.close()
        self.setup(ctx)

    def abandon(self, ctx: StepContext) -> None:
        self._service.abandon()  # pair averages not yet applied are dropped: the Worker averages the survivors

    def close(self, ctx: StepContext) -> None:
        self._service.close()  # every rank's requests are answered once this returns
        self._settle(ctx)  # so the last pairs' halves are applied and the average stays exact
