"""How asynchronous strategies talk: a communication thread per strategy, and what rides on it.

``CommThread`` polls the engine so large messages progress while the trainer computes; ``Mailbox`` keeps the
newest message of each neighbour; ``RequestService`` answers peers' requests without their trainer;
``PushBox``/``PullBox`` carry asynchronous gossip. ``framing`` is their one message format, ``tags`` their one
registry of tags. Strategy files hold algorithms only.
"""

from fast_core.transport.comm_thread import CommThread
from fast_core.transport.gossip_boxes import PullBox, PushBox
from fast_core.transport.mailbox import Mailbox, Message
from fast_core.transport.service import RequestService

__all__ = ["CommThread", "Mailbox", "Message", "PullBox", "PushBox", "RequestService"]
