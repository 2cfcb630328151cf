"""Virtual time for N workers that are real Python threads: one runs at a time, in the order of their clocks.

Why threads and not a rewrite of the strategies as event handlers: ``fast simulate`` runs FAST's own strategy code,
unchanged, so what it predicts is what that code does. Each worker's trainer is a thread that runs only while it
holds the baton; it gives the baton back whenever it would spend virtual time (a step's compute, a wait on a peer)
and the scheduler hands it to whichever event is due first. Code between two such points takes no virtual time.

A conservative discrete-event simulation: events run in (time, sequence) order, so the global clock never goes
back and a message can never arrive in a worker's past. Events are: wake a trainer, pump a rank's communication
threads (``fast_core.transport.CommThread`` on virtual time, run by ``transport.drivers.VirtualTimeDriver``: a
background thread's work at the moment a message lands), and monitors (the runner's evaluations at fixed virtual
times). Ties are broken by the order events were scheduled, so a run is deterministic for a seed.

A trainer that waits for something nobody has sent yet is *blocked*: it has no wake-up of its own and is woken by
the next event addressed to its rank. When no event is left and trainers are still blocked, no message can ever
come: the scheduler raises PeerTimeout in each, naming the ranks its requests await (an exact deadlock detector,
where a real job would wait for its timeout).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Deadlock", "VirtualScheduler"]


class Deadlock(Exception):
    """Raised inside a blocked trainer when nothing is left that could wake it."""


class VirtualScheduler:
    """Runs ``size`` trainer threads on one virtual clock (seconds from 0)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.now = 0.0
        self._queue: list[tuple[float, int, str, int, Any]] = []
        self._order = itertools.count()
        self._go = [threading.Semaphore(0) for _ in range(size)]
        self._back = threading.Semaphore(0)
        self._token = [0] * size  # a wake-up carries the token it was scheduled with; a stale one is dropped
        self._blocked = [False] * size
        self._finished = [False] * size
        self._deadlocked = [False] * size
        self.pumps: list[list[Callable[[], bool]]] = [[] for _ in range(size)]
        self._pump_due: list[set[float]] = [set() for _ in range(size)]
        self.running: int | None = None
        """The rank whose trainer holds the baton (None while the scheduler runs a pump or a monitor)."""
        self.events = 0
        self._live = 0  # events in the queue that can wake a trainer (all but monitors)

    # called by trainers ------------------------------------------------------------------------------------------
    def sleep_until(self, rank: int, when: float) -> None:
        """Give the baton back until virtual time ``when`` (a step's compute, or a wait whose end is known)."""
        self._token[rank] += 1
        self._push(max(when, self.now), "wake", rank, self._token[rank])
        self._suspend(rank)

    def block(self, rank: int) -> None:
        """Give the baton back until the next event addressed to ``rank`` (Deadlock if none can come)."""
        self._token[rank] += 1
        self._blocked[rank] = True
        try:
            self._suspend(rank)
        finally:
            self._blocked[rank] = False
        if self._deadlocked[rank]:
            self._deadlocked[rank] = False
            raise Deadlock(f"rank {rank}: nothing left in the simulation could complete this wait")

    def _suspend(self, rank: int) -> None:
        self.running = None
        self._back.release()
        self._go[rank].acquire()
        self.running = rank

    # called by the engine ----------------------------------------------------------------------------------------
    def notify(self, rank: int, when: float) -> None:
        """Something for ``rank`` is ready at ``when``: run its communication threads, then wake its trainer if it
        is blocked (it re-tests what it waits for)."""
        when = max(when, self.now)
        if self.pumps[rank] and when not in self._pump_due[rank]:
            self._pump_due[rank].add(when)
            self._push(when, "pump", rank, None)
        if self._blocked[rank]:
            self._push(when, "wake", rank, self._token[rank])

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` in the scheduler at virtual time ``when`` (monitors: evaluations of the consensus). Such
        an event never keeps a simulation alive: when only these are left and trainers wait, it is a deadlock."""
        self._push(max(when, self.now), "call", -1, action)

    def _push(self, when: float, kind: str, rank: int, payload: Any) -> None:
        if kind != "call":
            self._live += 1
        heapq.heappush(self._queue, (when, next(self._order), kind, rank, payload))

    # the loop ------------------------------------------------------------------------------------------------------
    def run(self, body: Callable[[int], None]) -> None:
        """Start one thread per rank running ``body(rank)`` and drive them all to their end."""
        errors: dict[int, BaseException] = {}

        def trainer(rank: int) -> None:
            self._go[rank].acquire()
            self.running = rank
            try:
                body(rank)
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller (run() returns them)
                errors[rank] = exc
            finally:
                self._finished[rank] = True
                self.running = None
                self._back.release()

        threads = [
            threading.Thread(target=trainer, args=(r,), name=f"fast-sim-{r}", daemon=True) for r in range(self.size)
        ]
        for thread in threads:
            thread.start()
        for rank in range(self.size):
            self._push(0.0, "wake", rank, self._token[rank])
        while True:
            if not self._live:
                stuck = [r for r in range(self.size) if not self._finished[r]]
                if not stuck:
                    break
                for rank in stuck:  # nothing can come any more: every one of them raises
                    self._deadlocked[rank] = True
                    self._resume(rank)
                continue
            when, _, kind, rank, payload = heapq.heappop(self._queue)
            if kind != "call":
                self._live -= 1
            self.now = when
            self.events += 1
            if kind == "wake":
                if payload == self._token[rank] and not self._finished[rank]:
                    self._resume(rank)
            elif kind == "pump":
                self._pump_due[rank].discard(when)
                self._pump(rank)
            else:
                payload()
        for thread in threads:
            thread.join()
        self.errors = errors

    def _resume(self, rank: int) -> None:
        self._token[rank] += 1  # any other wake-up scheduled for this rank is now stale
        self._go[rank].release()
        self._back.acquire()

    def _pump(self, rank: int) -> None:
        """Run ``rank``'s communication threads; a trainer blocked on them re-tests at once (what it waits for may
        be what they just did, announced to nobody else)."""
        self.pumps[rank] = [pump for pump in self.pumps[rank] if pump()]
        if self._blocked[rank]:
            self._push(self.now, "wake", rank, self._token[rank])
