"""A bounded, ordered stream of arrays between two neighbouring pipeline stages: activations forward, error
gradients backward. Raw buffers only, never pickled.

Each array travels as two messages on the channel's tag: a fixed-size header in the project's one message format
(``fast_core.transport.framing``: step and sequence number) whose payload is the array's layout (dtype code, ndim,
shape), then the array's bytes. The receiver reads the header first, so shapes may change from step to step (a
smaller last batch). After each array the receiver returns an 8-byte acknowledgement on ``tag + 1``; a sender with
``depth`` arrays not yet received waits for one. Why: an engine's send completes as soon as the message is buffered
(always in-process, for small messages under MPI), so only acknowledgements bound how far a stage runs ahead of its
neighbour, which is the delay of the decoupled updates and the memory of the queue.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import DTypeLike

from fast_core.config.run import check_timeout
from fast_core.engine import Engine, Request
from fast_core.engine.base import MAX_USER_TAG
from fast_core.errors import MessageError, PeerTimeout
from fast_core.transport import framing

__all__ = ["DTYPES", "MAX_NDIM", "Channel"]

DTYPES = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32, np.int64))
"""The dtypes a channel carries; a header names one by its index + 1 (0 is never sent)."""
MAX_NDIM = 8
"""Dimensions a header has room for."""
_LAYOUT_WORDS = 2 + MAX_NDIM  # dtype code, ndim, the dims (unused ones 0)


class Channel:
    """Send arrays to, and receive arrays from, rank ``peer`` of ``engine`` on tags ``tag`` and ``tag + 1``.

    ``send(array, step)`` copies the array and returns at once, unless ``depth`` arrays sent are still unreceived:
    then it waits for the peer to receive one. ``recv(step)`` blocks until the peer's next array arrives and checks
    that it is the one of ``step``. Every wait lasts at most ``timeout`` seconds (default: the engine's) and then
    raises PeerTimeout naming the peer and the step. ``dtype`` (optional) is what both ends must send. One thread
    uses a channel; both ends make one with the same tag, and a pair of ranks needs tags 2 apart for two channels
    (``PipelineTag``). ``depth`` is the queue bound: a schedule in which the receiver takes the array of step t only
    after the sender has sent that of step t + k needs depth >= k + 1, else both wait until the timeout.
    """

    def __init__(
        self,
        engine: Engine,
        peer: int,
        tag: int,
        timeout: float | None = None,
        depth: int = 2,
        dtype: DTypeLike | None = None,
    ) -> None:
        engine.check_peer(peer)
        if not 0 <= tag < MAX_USER_TAG - 1:
            raise ValueError(f"a channel uses tags {tag} and {tag + 1}: give a tag in 0..{MAX_USER_TAG - 2}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth={depth!r}: give the number of arrays that may wait unreceived, an int >= 1")
        self.engine = engine
        self.peer = peer
        self.tag = tag
        self.timeout = engine.timeout if timeout is None else check_timeout(timeout)
        self.depth = depth
        self.dtype = None if dtype is None else _check_dtype(np.dtype(dtype))
        self.sent = 0
        """Arrays sent so far."""
        self.acknowledged = 0
        """Arrays the peer has confirmed receiving so far."""
        self.received = 0
        """Arrays received so far."""
        self.closed = False
        self._last_step: int | None = None
        self._sends: deque[tuple[list[Request], np.ndarray, np.ndarray]] = deque()  # buffers live until sent
        self._credit = np.zeros(1, dtype=np.int64)
        self._credit_request: Request | None = None
        self._credit_sends: list[tuple[Request, np.ndarray]] = []
        self._header = framing.allocate(_LAYOUT_WORDS * 8)
        self._header_request: Request | None = None

    def __repr__(self) -> str:
        return (
            f"Channel(rank {self.engine.rank} <-> rank {self.peer}, tag {self.tag}, depth {self.depth}: "
            f"{self.sent} sent, {self.acknowledged} acknowledged, {self.received} received)"
        )

    @property
    def unreceived(self) -> int:
        """Arrays sent that the peer has not confirmed receiving yet (at most ``depth``)."""
        return self.sent - self.acknowledged

    # sending ---------------------------------------------------------------------------------------------------
    def send(self, array: np.ndarray, step: int) -> None:
        """Send a copy of ``array`` as the one of ``step``; waits only while ``depth`` arrays are unreceived."""
        self._check_open()
        array = np.asarray(array)
        layout = self._layout(array)
        self._make_room(step)
        header = framing.allocate(_LAYOUT_WORDS * 8)
        framing.write(header, layout, step, self.sent + 1)
        data = np.array(array, order="C", copy=True).reshape(-1)
        requests = [self.engine.isend(header, self.peer, self.tag), self.engine.isend(data, self.peer, self.tag)]
        self._sends.append((requests, header, data))
        self.sent += 1
        self._last_step = step

    def _layout(self, array: np.ndarray) -> np.ndarray:
        dtype = _check_dtype(array.dtype)
        if self.dtype is not None and dtype != self.dtype:
            raise ValueError(f"{self!r} carries {self.dtype} arrays, got {dtype}: convert it before sending")
        if array.ndim > MAX_NDIM:
            raise ValueError(f"a channel carries arrays of at most {MAX_NDIM} dimensions, got shape {array.shape}")
        layout = np.zeros(_LAYOUT_WORDS, dtype=np.int64)
        layout[:2] = (DTYPES.index(dtype) + 1, array.ndim)
        layout[2 : 2 + array.ndim] = array.shape
        return layout

    def _make_room(self, step: int) -> None:
        """Wait until fewer than ``depth`` arrays are unreceived and fewer than ``depth`` sends are in flight."""
        self._absorb_credits()
        while self.unreceived >= self.depth:
            self._wait_for_credit(f"to send step {step}")
        while self._sends and all(r.test() for r in self._sends[0][0]):
            self._sends.popleft()
        if len(self._sends) >= self.depth:
            self._wait_sends(list(self._sends)[: len(self._sends) - self.depth + 1], f"step {step}")

    def _wait_for_credit(self, what: str) -> None:
        """Wait for the peer's next acknowledgement, at most the timeout."""
        try:
            self.engine.wait(self._credit_request, self.timeout)
        except PeerTimeout:
            raise PeerTimeout(
                f"rank {self.engine.rank} waited {self.timeout:g} s {what} to rank {self.peer} (channel tag "
                f"{self.tag}): rank {self.peer} has received {self.acknowledged} of the {self.sent} arrays sent and "
                f"at most depth={self.depth} may wait unreceived. The peer may be slower, stuck, dead, or not "
                "receiving on this tag",
                ranks=(self.peer,),
            ) from None
        self._absorb_credits()

    def _absorb_credits(self) -> None:
        """Count every acknowledgement that arrived; keeps one receive for the next posted."""
        if self._credit_request is None:
            self._credit_request = self.engine.irecv(self._credit, self.peer, self.tag + 1)
        while self._credit_request.test():
            self.acknowledged = max(self.acknowledged, int(self._credit[0]))
            self._credit_request = self.engine.irecv(self._credit, self.peer, self.tag + 1)

    def _wait_sends(self, sends: list[tuple[list[Request], np.ndarray, np.ndarray]], what: str) -> None:
        try:
            self.engine.wait_all([r for requests, *_ in sends for r in requests], self.timeout)
        except PeerTimeout as exc:
            raise PeerTimeout(
                f"rank {self.engine.rank} (channel tag {self.tag}, {what}): {exc}", ranks=(self.peer,)
            ) from None
        for item in sends:
            self._sends.remove(item)

    # receiving -------------------------------------------------------------------------------------------------
    def recv(self, step: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The peer's next array, which must be the one of ``step`` (and of ``shape``, when given): a new array.

        A mismatch raises MessageError after the array was taken, so the channel stays in order."""
        self._check_open()
        if self._header_request is None:  # kept across a timeout: a retry waits for the same message
            self._header_request = self.engine.irecv(self._header, self.peer, self.tag)
        self._wait_for(self._header_request, step)
        self._header_request = None
        layout, sent_step, sequence = framing.read(self._header, np.int64)
        code, ndim = int(layout[0]), int(layout[1])
        if not 1 <= code <= len(DTYPES) or not 0 <= ndim <= MAX_NDIM:
            raise MessageError(
                f"rank {self.engine.rank} received a header from rank {self.peer} (channel tag {self.tag}) with "
                f"dtype code {code} and {ndim} dimensions: not a channel's message (another sender on this tag?)"
            )
        array = np.empty(tuple(int(n) for n in layout[2 : 2 + ndim]), dtype=DTYPES[code - 1])
        self._wait_for(self.engine.irecv(array.reshape(-1), self.peer, self.tag), step)
        self.received += 1
        self._acknowledge()
        self._check_received(array, step, sent_step, sequence, shape)
        return array

    def _wait_for(self, request: Request, step: int) -> None:
        try:
            self.engine.wait(request, self.timeout)
        except PeerTimeout:
            raise PeerTimeout(
                f"rank {self.engine.rank} waited {self.timeout:g} s for step {step} from rank {self.peer} (channel "
                f"tag {self.tag}; {self.received} arrays received before). The peer may be slower, stuck, dead, or "
                "not sending on this tag; raise the timeout if it is only slow",
                ranks=(self.peer,),
            ) from None

    def _acknowledge(self) -> None:
        self._credit_sends = [(r, buf) for r, buf in self._credit_sends if not r.test()]
        count = np.array([self.received], dtype=np.int64)
        self._credit_sends.append((self.engine.isend(count, self.peer, self.tag + 1), count))

    def _check_received(
        self, array: np.ndarray, step: int, sent_step: int, sequence: int, shape: tuple[int, ...] | None
    ) -> None:
        where = f"rank {self.engine.rank} from rank {self.peer} (channel tag {self.tag})"
        if sequence != self.received:
            raise MessageError(
                f"{where}: array number {sequence} arrived as number {self.received}: arrays were lost or another "
                "sender uses this tag"
            )
        if sent_step != step:
            raise MessageError(
                f"{where}: expected the array of step {step} but received that of step {sent_step}: the two stages' "
                "schedules disagree"
            )
        if self.dtype is not None and array.dtype != self.dtype:
            raise MessageError(f"{where}: expected {self.dtype} but received {array.dtype} (step {step})")
        if shape is not None and array.shape != tuple(shape):
            raise MessageError(f"{where}: expected shape {tuple(shape)} but received {array.shape} (step {step})")

    # ending ----------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait until the peer has received every array sent and our sends are complete, then drop the receives
        still posted. Receive all the peer sends before closing: its close waits for that.

        Why wait for the peer: a receive cancelled while a message can still match it (the peer's last
        acknowledgement) made MPICH 5.0 kill the job in MPI_Finalize; once all is acknowledged none can."""
        if self.closed:
            return
        self._absorb_credits()
        while self.unreceived > 0:
            self._wait_for_credit(f"to close after sending step {self._last_step}")
        self._wait_sends(list(self._sends), "closing")
        self.engine.wait_all([r for r, _ in self._credit_sends], self.timeout)
        self._credit_sends = []
        for request in (self._credit_request, self._header_request):  # the header's: only after a timed-out recv
            if request is not None and not request.test():
                request.cancel()
        self.closed = True

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"{self!r} is closed: make a new channel (with another tag) to go on")


def _check_dtype(dtype: np.dtype) -> np.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"a channel carries {', '.join(map(str, DTYPES))} arrays, got {dtype}: convert it first")
    return dtype
