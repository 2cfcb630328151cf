"""What every strategy is: three hooks around the optimizer step, written once against the Worker."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..worker import Worker


class Strategy:
    """Base class of all strategies; hooks default to doing nothing.

    ``setup`` runs once all ranks hold the same parameters; ``before_step`` sees the gradients of the last
    backward pass before the user's optimizer uses them; ``after_step`` sees the parameters the optimizer left;
    ``close`` completes any communication still in flight.
    """

    name = "strategy"

    @property
    def lockstep(self) -> bool:
        """True when every rank must take part in every step, so a rank out of data must keep joining in
        (Worker.join); asynchronous strategies are False."""
        return bool(getattr(self, "synchronous", True))

    @property
    def uses_gradients(self) -> bool:
        """True when the strategy reads or replaces gradients (all-reduce, FAST): an adapter must then expose the
        gradient and apply one through the user's optimizer; parameter strategies need only the parameters."""
        return type(self).before_step is not Strategy.before_step

    def setup(self, worker: Worker) -> None:
        """Allocate buffers and start whatever communication precedes the first step."""

    def before_step(self, worker: Worker) -> None:
        """Act on the gradients (gradient strategies)."""

    def after_step(self, worker: Worker) -> None:
        """Act on the parameters (parameter strategies)."""

    def end_epoch(self, worker: Worker, metric: float) -> None:
        """React to the end of an epoch with this worker's validation metric (e.g. FAST's best-replica restart)."""

    def close(self, worker: Worker) -> None:
        """Complete pending communication."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"
