"""A shared work budget: the job trains a number of samples summed over all ranks, or for a wall-clock duration,
and every rank stops once it is spent. Under an asynchronous strategy a faster rank simply does more of the work.

The trainer asks before each batch: ``n = worker.claim_batch(batch_size)`` is how many samples to train now
(``batch_size``, fewer on the job's last grant), 0 once the budget is spent (stop, then ``close()``); the claims go
through ``fast_core.runtime.claims``. How the ranks agree, with no blocking collective on an asynchronous training
path:

- Asynchronous strategy, sample budget: rank 0 holds the one counter. Its RequestService grants samples to the
  other ranks at rank 0's own claims (inline: a thread polling for 16-byte messages cost the trainers more, on one
  core per rank, than a grant's wait; a backstop thread answers every 20 ms while rank 0's trainer makes no call,
  say in a collective); each rank reserves its next batches ahead, so its trainer normally finds the grant already
  there (when it must wait, the wait has the engine's timeout and names rank 0). How many it reserves adapts: one
  batch at first, one more each time a reserved grant had not arrived when the trainer needed it (steps shorter
  than a grant's round trip), up to ``MAX_AHEAD``; ``Budget(ahead=k)`` fixes it at k. Rank 0 grants at most a
  ``2 * ranks``-th of what is left (whole batches, at least one), so reservations shrink to single batches as the
  budget runs out (guided self-scheduling). Rank 0's own trainer takes from the same counter under the service
  lock. The counter never goes below 0, so the samples trained sum
  to the budget exactly: the last grant may be a partial batch. The stop signal is the moment the counter reaches
  0 (``Allowance.spent_at`` on rank 0); after it a rank trains only what it had reserved: at most one batch with
  ``ahead=1``, 2k - 1 with ``ahead=k``.
- Lockstep strategy, sample budget: no messages per step. At the first claim one allreduce sums the ranks' batch
  sizes (the job's samples per step); every rank then runs floor(samples / that) steps. The remainder, less than
  one step of the job, is not trained: the sum equals the budget when the budget is a multiple of that step.
- A lockstep warm-up, then an asynchronous strategy (``warmup=W``, a ``Schedule``): the warm-up's steps count as
  lockstep ones (``Strategy.lockstep_steps``); at the first asynchronous step, which every rank reaches together,
  rank 0's counter starts with what the warm-up left. A lockstep phase after an asynchronous one is refused.
- Seconds: each rank's clock, from a barrier at the start. Asynchronous: a rank stops at its first claim after the
  deadline. Lockstep: one 8-byte allreduce per claim (the ranks' largest elapsed time) so all stop at the same
  step; lockstep strategies wait for each other every step anyway.

Both may be given; the first one spent ends training. The job's sum is one allreduce in ``close`` (collective).
A budget takes the place of ``join()`` for uneven inputs: no rank runs out of data, each keeps drawing batches.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

import numpy as np

from fast_core.config.run import RunConfig, check_budget
from fast_core.engine import Engine
from fast_core.errors import ConfigError
from fast_core.transport import RequestService

log = logging.getLogger("fast")

MAX_AHEAD = 16
"""The most batches an adaptive reservation (``Budget(ahead=None)``) grows to."""


@dataclass(frozen=True)
class Budget:
    """How much the whole job trains: ``samples`` summed over all ranks, and/or wall-clock ``seconds`` from the
    common start (the first spent ends training). Global epochs are ``samples / dataset size``: convert before."""

    samples: int | None = None
    seconds: float | None = None
    ahead: int | None = None
    """Asynchronous sample budget: the batches each rank reserves at a time from rank 0. None (the default) adapts:
    1 at first, one more whenever the trainer had to wait for a reserved grant, up to ``MAX_AHEAD``. ``k`` fixes it:
    with 1 every rank trains at most one batch after the stop signal but a rank whose steps are shorter than a
    grant's round trip (a millisecond or more; more when rank 0's trainer holds Python's GIL) waits for grants;
    ``k`` makes it wait k times less often, training at most 2k - 1 batches after the signal."""

    def __post_init__(self) -> None:
        samples, seconds = check_budget(self.samples, self.seconds)
        object.__setattr__(self, "samples", samples)
        object.__setattr__(self, "seconds", seconds)
        if self.ahead is None:
            return
        if isinstance(self.ahead, bool) or not isinstance(self.ahead, int | np.integer) or self.ahead < 1:
            raise ConfigError(
                f"Budget(ahead={self.ahead!r}): give the batches a rank reserves at a time, >= 1, e.g. 4 (or None "
                "to adapt it)"
            )
        object.__setattr__(self, "ahead", int(self.ahead))

    @property
    def most_ahead(self) -> int:
        """The most batches a rank may hold reserved at a time: ``ahead``, or ``MAX_AHEAD`` when it adapts."""
        return MAX_AHEAD if self.ahead is None else self.ahead

    @classmethod
    def from_config(cls, config: RunConfig) -> Budget | None:
        """The budget ``fast run --budget-samples/--budget-seconds`` asked for, or None (no budget)."""
        if config.budget_samples is None and config.budget_seconds is None:
            return None
        return cls(config.budget_samples, config.budget_seconds)


def check_batch_size(batch_size: object) -> int:
    """A claim's size: a whole number >= 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise ValueError(f"claim_batch({batch_size!r}): give the number of samples of the next batch, >= 1")
    return int(batch_size)


class Allowance:
    """One rank's account of a Budget while it trains: ``start`` and ``close`` are collective; ``claim`` before
    each batch. ``engine`` is the worker's (metered) engine."""

    def __init__(self, budget: Budget, engine: Engine, lockstep_steps: float, first_step: int = 0) -> None:
        self.budget = budget
        self.engine = engine
        self.lockstep_steps = lockstep_steps
        """Steps from ``first_step`` in which every rank runs in lockstep (``Strategy.lockstep_steps``): counted
        without messages; after them (an all-reduce warm-up ended) the ranks share rank 0's counter."""
        self.first_step = first_step
        self.spent = False
        """True once a claim returned 0: every later claim returns 0 at once."""
        self._shared: SharedSamples | None = None
        self._steps_left: int | None = None  # lockstep sample budget, fixed at the first claim
        self._job_step = 0  # the job's samples per lockstep step
        self._lockstep_samples = 0  # samples the job trained in lockstep steps (the same count on every rank)
        self._batch = 0  # this rank's last lockstep batch size
        self.started = 0.0
        """``time.monotonic()`` at the common start (after ``start``): a seconds budget is measured from it."""

    @property
    def spent_at(self) -> float | None:
        """Rank 0 under an asynchronous sample budget: the ``time.monotonic()`` at which the counter reached 0
        (the stop signal); None elsewhere or before."""
        return None if self._shared is None else self._shared.spent_at

    @property
    def samples_left(self) -> int | None:
        """Samples of a sample budget not granted yet (None without one): rank 0 holds an asynchronous budget's
        counter, the other ranks its value at their last grant; a lockstep budget is counted alike on every rank."""
        if self.budget.samples is None:
            return None
        if self._shared is not None:
            return self._shared.remaining if self._shared.rank == 0 else self._shared.last_left
        return max(0, self.budget.samples - self._lockstep_samples)

    @property
    def ahead(self) -> int | None:
        """Under an asynchronous sample budget, the batches this rank now reserves at a time; None elsewhere."""
        return None if self._shared is None else self._shared.ahead

    def start(self) -> Allowance:
        """Collective: set up rank 0's grant service (asynchronous sample budget) and the common start."""
        if self.budget.samples is not None and self.lockstep_steps == 0:
            self._shared = SharedSamples(self.budget.samples, self.engine, self.budget.ahead)
        if self.budget.seconds is not None:
            self.engine.barrier()  # the common start every rank's clock measures from
        self.started = time.monotonic()
        return self

    def claim(self, batch_size: int, step: int) -> int:
        """Samples to train in the next batch (at most ``batch_size``), 0 once the budget is spent; ``step`` is the
        worker's step about to run (it tells a lockstep warm-up from what follows)."""
        if self.spent:
            return 0
        lockstep = step - self.first_step < self.lockstep_steps
        granted = 0 if self._out_of_time(lockstep) else self._samples(batch_size, lockstep)
        self.spent = granted == 0
        return granted

    def resume(self, spent: int) -> None:
        """A checkpoint says the job already trained ``spent`` samples (every rank, before its first claim): only
        the rest of a sample budget is trained. A seconds budget starts afresh."""
        if self.budget.samples is None:
            return
        left = max(0, self.budget.samples - spent)
        self.spent = left == 0
        if left:
            self.budget = replace(self.budget, samples=left)
        if self._shared is not None:
            with self._shared.lock:
                self._shared.remaining = left

    def abandon(self) -> None:
        """A rank was lost (fault-tolerant engine): stop rank 0's grant service at once, with no collective."""
        if self._shared is not None:
            self._shared.abandon()

    def rejoin(self, member: bool = True) -> None:
        """Collective over the group after it changed (``fast_core.runtime.survival``; the Worker aligned the steps):
        the lost ranks' share of the budget is taken over by the others. ``member``: this rank was in the group before
        (False on a replacement, whose Allowance was never started). A seconds budget keeps the job's start.
        Lockstep: the steps left follow from the samples the job has left and the group's samples per step.
        Asynchronous: rank 0 of the group holds the counter again (``regrouped_samples``)."""
        elapsed = np.array([time.monotonic() - self.started if member else 0.0])
        self.engine.allreduce(elapsed, op="max")
        self.started = time.monotonic() - float(elapsed[0])
        if self.budget.samples is None:
            return
        agreed = np.array([self.budget.samples if member else 0], dtype=np.int64)
        self.engine.allreduce(agreed, op="max")  # a newcomer takes the job's budget, not the one its script made
        self.budget = replace(self.budget, samples=int(agreed[0]))  # (its shard, so its global epoch, may differ)
        phase = np.array([self._shared is not None, self._steps_left is not None], dtype=np.int64)
        self.engine.allreduce(phase, op="max")
        if phase[0]:
            self._shared = regrouped_samples(self.engine, self._shared if member else None, self.budget.ahead)
        elif phase[1]:
            counts = np.array([self._lockstep_samples, self._batch], dtype=np.int64)
            self.engine.allreduce(counts, op="max")  # a rank one step ahead already counted that step
            per_step = np.array([self._batch, not member], dtype=np.int64)
            self.engine.allreduce(per_step)
            self._lockstep_samples = int(counts[0])
            self._job_step = int(per_step[0] + per_step[1] * counts[1])  # a newcomer's batch: the largest one
            self._steps_left = max(0, self.budget.samples - self._lockstep_samples) // self._job_step

    def close(self, samples: int) -> int:
        """Collective: stop the grant service and return the job's samples (this rank trained ``samples``)."""
        if self._shared is not None:
            self._shared.close()
        total = np.array([samples], dtype=np.int64)
        self.engine.allreduce(total)
        if self.engine.rank == 0:
            log.info("budget %s: %d samples trained by the job", self.budget, int(total[0]))
        return int(total[0])

    # ---------------------------------------------------------------------------------------------------------------
    def _out_of_time(self, lockstep: bool) -> bool:
        if self.budget.seconds is None:
            return False
        elapsed = np.array([time.monotonic() - self.started])
        if lockstep:
            self.engine.allreduce(elapsed, op="max")  # every rank stops at the same step
        return bool(elapsed[0] >= self.budget.seconds)

    def _samples(self, batch_size: int, lockstep: bool) -> int:
        if self.budget.samples is None:
            return batch_size
        if not lockstep:
            if self._shared is None:  # the first step after a lockstep warm-up: every rank is at this same step
                left = self.budget.samples - self._lockstep_samples
                self._shared = SharedSamples(left, self.engine, self.budget.ahead)
            return self._shared.claim(batch_size)
        self._batch = batch_size
        if self._steps_left is None:
            self._steps_left = self._lockstep_steps(batch_size)
        if self._steps_left == 0:
            return 0
        self._steps_left -= 1
        self._lockstep_samples += self._job_step
        return batch_size

    def _lockstep_steps(self, batch_size: int) -> int:
        """floor(samples / the job's samples per step), from one allreduce of the ranks' first batch sizes."""
        per_step = np.array([batch_size], dtype=np.int64)
        self.engine.allreduce(per_step)
        samples, job_step = self.budget.samples, int(per_step[0])
        self._job_step = job_step
        if samples < job_step:
            raise ConfigError(
                f"Budget(samples={samples}) is less than one step of this job ({job_step} samples over "
                f"{self.engine.size} ranks): give at least {job_step}, or smaller batches"
            )
        return samples // job_step


class SharedSamples:
    """An asynchronous sample budget: rank 0's counter, granted to the other ranks by its RequestService.

    A rank other than 0 keeps at most one request in flight, for its next ``ahead`` batches, asked as soon as the
    previous grant arrived, and a ``credit`` of samples granted but not yet trained: at most ``2 * ahead - 1``
    untrained batches in all, so that many at most after the stop signal. ``ahead=None`` adapts (module docstring).
    A request is (samples wanted, batch size); a reply (samples granted, samples left on rank 0's counter).
    """

    def __init__(self, total: int, engine: Engine, ahead: int | None = None) -> None:
        self.rank, self.size = engine.rank, engine.size
        self.adaptive = ahead is None
        self.ahead = 1 if ahead is None else ahead
        self.remaining = total
        """Rank 0: samples not granted yet (read and written under ``lock``)."""
        self.spent_at: float | None = None
        self.last_left = total
        """The counter as this rank last heard it (rank 0's reply): what survivors fall back on if rank 0 is lost."""
        self._credit = 0
        self._asked = 0  # size of the request in flight, 0 when none
        self._reserved = False  # the request in flight was asked ahead of need (a wait for it means: ask earlier)
        self._exhausted = False  # rank 0's counter is at 0: nothing more to ask for
        self._service: RequestService | None = None
        self.lock = threading.Lock()
        if self.size > 1:
            askers = range(1, self.size) if self.rank == 0 else ()
            handler = self._answer if self.rank == 0 else None
            self._service = RequestService(engine, askers, 2, np.int64, handler, name="budget", inline=True)
            self.lock = self._service.lock

    def claim(self, batch_size: int) -> int:
        if self.rank == 0:
            if self._service is not None:
                self._service.poll()  # the grants are answered on this thread, at its claims (and its other calls)
            with self.lock:
                return self._take(batch_size)
        while self._credit < batch_size and not self._exhausted:  # twice only when the batch size grew
            if not self._asked:
                self._ask(batch_size - self._credit, batch_size, reserved=False)
            self._collect()
        granted = min(batch_size, self._credit)
        self._credit -= granted
        if not self._exhausted and not self._asked:
            self._ask(batch_size * self.ahead, batch_size, reserved=True)  # the next claims normally find it there
        return granted

    @property
    def credit(self) -> int:
        """Samples granted to this rank and not trained yet."""
        return self._credit

    def abandon(self) -> None:
        """Stop answering and asking for grants at once (a rank was lost); ``regrouped_samples`` makes the group's
        counter."""
        if self._service is not None:
            self._service.abandon()

    def close(self) -> None:
        """Collective: rank 0's thread serves until every rank has closed (a last reservation is answered)."""
        if self._service is not None:
            self._service.close()

    # rank 0 ---------------------------------------------------------------------------------------------------------
    def _take(self, wanted: int) -> int:
        """Grant up to ``wanted`` samples from the counter (under ``lock``)."""
        granted = min(wanted, self.remaining)
        self.remaining -= granted
        if self.remaining == 0 and self.spent_at is None:
            self.spent_at = time.monotonic()
        return granted

    def _answer(self, peer: int, request: np.ndarray, reply: np.ndarray) -> None:
        wanted, batch = max(0, int(request[0])), max(1, int(request[1]))
        share = self.remaining // (2 * self.size)
        reply[0] = self._take(min(wanted, max(batch, share - share % batch)))
        reply[1] = self.remaining

    # other ranks ----------------------------------------------------------------------------------------------------
    def _ask(self, wanted: int, batch_size: int, reserved: bool) -> None:
        self._service.ask(0, np.array([wanted, batch_size], dtype=np.int64))
        self._asked, self._reserved = wanted, reserved

    def _collect(self) -> None:
        """Add the grant in flight to the credit, waiting for it if it has not arrived."""
        if self.adaptive and self._reserved and not self._service.answered and self.ahead < MAX_AHEAD:
            self.ahead += 1  # the reservation was too short for the round trip
        reply = self._service.reply()  # PeerTimeout naming rank 0 after the engine's timeout
        self._credit += int(reply[0])
        self.last_left = int(reply[1])
        self._exhausted = self.last_left == 0
        self._asked = 0


def regrouped_samples(engine: Engine, before: SharedSamples | None, ahead: int | None) -> SharedSamples:
    """Collective over a changed group: the counter on its rank 0, holding what the job has left. If the counter's
    rank survived, its count is exact; else the survivors' smallest last-seen count is used (grants made after it
    to the lost ranks are not known: a few batches more may be trained). Grants the members held but had not
    trained go back to the counter; a lost rank's are spent with it. ``before``: this rank's counter share before
    (None on a replacement)."""
    if before is None:
        known = np.array([-1, -np.iinfo(np.int64).max, 0], dtype=np.int64)
    else:
        exact = before.remaining if before.rank == 0 else -1
        known = np.array([exact, -before.last_left, before.credit], dtype=np.int64)
    engine.allreduce(known[:2], op="max")
    engine.allreduce(known[2:])
    exact, last_seen, credit = int(known[0]), -int(known[1]), int(known[2])
    after = SharedSamples((exact if exact >= 0 else last_seen) + credit, engine, ahead)
    if before is not None:
        after.ahead, after.spent_at = before.ahead, before.spent_at
    return after

