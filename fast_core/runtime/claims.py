"""One rank's claims on the job's shared work budget (``fast_core.runtime.budget``), all through one path that the
group's recovery covers: a rank lost during a claim is survived and the claim asked again of the group after.

``Worker.claim_batch(n)`` is the trainer's call (once per batch, counted in ``metrics.samples``). A trainer that
must know a batch's grant before the batch begins, as Keras' fit does, ``reserve``s it while the step before runs;
the next ``claim_batch`` then takes (and counts) the reserved grant instead of asking again.
"""

from __future__ import annotations

import math

from fast_core.runtime.budget import Allowance, Budget
from fast_core.runtime.group import Group


class Claims:
    """The budget a Worker trains under (None: no budget, every claim is granted whole), its allowance once training
    started, and the claims of this rank."""

    def __init__(self, budget: Budget | None, group: Group) -> None:
        self.budget = budget
        self.samples_before = 0
        """Samples the job trained before a checkpoint this worker resumed from (``Worker.resume``)."""
        self._group = group
        self._last: tuple[int, int] | None = None  # (step, samples) of the last claim_batch
        self._reserved: int | None = None  # a grant reserved ahead of its batch, not counted yet

    @property
    def allowance(self) -> Allowance | None:
        """This rank's account of the budget while it trains (``fast_core.runtime.budget.Allowance``)."""
        return self._group.state.allowance

    @property
    def started_at(self) -> float | None:
        """``time.monotonic()`` at the budget's common start (the seconds budget counts from it); None without one."""
        return None if self.allowance is None else self.allowance.started

    def open(self, lockstep_steps: float, joining: bool = False) -> None:
        """At the Worker's start (collective under a budget): the allowance, started from the current step; a
        replacement's (``joining``) is started by the group's join instead."""
        if self.budget is None:
            return
        state = self._group.state
        allowance = Allowance(self.budget, state.context.engine, lockstep_steps, first_step=state.step)
        state.allowance = allowance if joining else allowance.start()
        state.context.metrics.samples_left = allowance.samples_left

    def batch(self, batch_size: int) -> int:
        """``Worker.claim_batch``: the grant for this step's batch (the same when asked again before the step ends),
        a reserved one if there is one, counted in ``metrics.samples``."""
        step = self._group.state.step
        if self._last is not None and self._last[0] == step:
            return self._last[1]
        granted = self._reserved if self._reserved is not None else self._claim(batch_size, ahead=0)
        self._reserved = None
        metrics = self._group.state.context.metrics
        metrics.samples += granted
        if self.allowance is not None:
            metrics.samples_left = self.allowance.samples_left
        self._last = (step, granted)
        return granted

    def reserve(self, batch_size: int) -> int:
        """Claim the next batch before it begins, not counted until ``claim_batch`` takes it: the batch after this
        step's when this step's is claimed, else this step's."""
        claimed = self._last is not None and self._last[0] == self._group.state.step
        self._reserved = self._claim(batch_size, ahead=int(claimed))
        return self._reserved

    def collective_passes(self, job_pass: int, batch_size: int) -> int | None:
        """Under a budget, after how many of its passes over its shard this rank may still call an epoch-end
        collective (``end_epoch``: FAST's restart) knowing every rank calls it too. ``job_pass``: the samples one
        pass of every rank trains (a global epoch). None: after every pass (a lockstep strategy: all ranks run the
        same steps, or no budget). Asynchronous: the passes every rank finishes before the budget is spent (for a
        resumed job, what it had left), whatever the ranks' speeds; while a rank waits after pass k, the job has
        trained at most k global epochs plus the batches the ranks reserved (two per rank and ``ahead``), so
        k <= (samples - that) / job_pass; 0 when the budget has seconds (the ranks' passes when time is up are
        unknown)."""
        state = self._group.state
        if self.budget is None or math.isinf(state.strategy.lockstep_steps()):
            return None
        if self.budget.samples is None or self.budget.seconds is not None:
            return 0
        reserved = 2 * self.budget.most_ahead * state.engine.size * batch_size
        return max(0, (self.budget.samples - self.samples_before - reserved) // job_pass)

    def resume(self, samples_before: int) -> None:
        """A checkpoint says the job trained ``samples_before`` samples (collective under a budget): only the rest
        is trained, and no claim made before holds."""
        self.samples_before = int(samples_before)
        self._last = self._reserved = None
        if self.allowance is not None:
            self.allowance.resume(self.samples_before)
            self._group.state.engine.barrier()  # rank 0's counter holds what is left before any rank claims from it

    def close(self) -> None:
        """Collective under a budget: the grant service stops and the job's samples are summed into the metrics."""
        if self.allowance is not None:
            metrics = self._group.state.context.metrics
            metrics.job_samples = self.allowance.close(metrics.samples)

    def _claim(self, batch_size: int, ahead: int) -> int:
        allowance = self.allowance
        if allowance is None:
            return batch_size
        state = self._group.state
        return self._group.collective(lambda: allowance.claim(batch_size, state.step + ahead))

