"""Every message tag FAST uses, in one place, so two kinds of message can never be confused.

Synchronous strategies exchange on the trainer's engine; each communication thread works on its own duplicate
of the engine, so its tags only need to differ from those of the same thread. Engines reserve tags from
``engine.base.MAX_USER_TAG`` up for their own bookkeeping.
"""

from __future__ import annotations

from enum import IntEnum


class Tag(IntEnum):
    """Tags on the trainer's engine: one per synchronous exchange, so a late message of one kind never lands in
    another's receive (after a Schedule switch, say)."""

    PARAMETERS = 0  # D-PSGD's neighbour exchange, synchronous FAST's gradients, synchronous EASGD's round
    PUSH_SUM = 41  # SGP's (x, w) pushes
    GOSSIP = 43  # synchronous gossip
    RING = 45  # the compressed ring all-reduce's chunks (allreduce:compress=...)
    PSEUDO_GRADIENTS = 47  # decentralized DiLoCo's outer round
    PS_PUSH = 49  # synchronous parameter server: a worker's gradient shard to its server
    PS_PULL = 51  # synchronous parameter server: the averaged shard back to every worker


class MailboxTag(IntEnum):
    """On a Mailbox's own engine."""

    PAYLOAD = 0  # the newest payload of a neighbour
    FINISHED = 1  # "I closed: wait for nothing more from me"


class ServiceTag(IntEnum):
    """On a RequestService's own engine."""

    REQUEST = 0
    REPLY = 1


class GossipTag(IntEnum):
    """On an asynchronous gossip box's own engine."""

    NOTICE = 1  # push: "a payload follows"
    PAYLOAD = 2  # push: the payload
    ASK = 3  # pull: "send me your parameters"
    REPLY = 4  # pull: the parameters


class PipelineTag(IntEnum):
    """On the job's engine, between neighbouring stages of a pipeline (``fast_core.pipeline.Channel``). A channel
    takes its tag and the next one (the receiver's acknowledgements), hence the gaps."""

    ACTIVATIONS = 60  # forward: stage k -> stage k + 1
    ERRORS = 62  # backward: the error gradient, stage k + 1 -> stage k
    EVALUATION = 64  # forward only, between training ticks: stage k -> stage k + 1
