"""The NumPy rule DiLoCo is checked against, for the core's cases and each adapter's: every worker's row at once."""

from __future__ import annotations

import numpy as np

from fast_core.topology import make_topology


class DiLoCoReference:
    """After each step k, the outer step of every fragment f with (k + 1 + f*period//fragments) % period == 0: the
    pseudo-gradients D = Theta - mean(X) (or Theta - W X with the topology's W, indexed by the count of outer
    exchanges so far), then V <- mu V + D, Theta <- Theta - outer_lr (D + mu V) (outer_lr V without Nesterov),
    X <- Theta. ``parts``: np.array_split of the parameter indices into ``fragments``.

    ``overlap`` tau > 0 (Streaming DiLoCo's overlap): D is taken after step k as above, but the outer step waits
    until after step k + tau, and then X <- alpha X + (1 - alpha) Theta with X as it is then; ``finish`` (close)
    applies one still pending."""

    def __init__(
        self,
        period: int,
        outer_lr: float = 0.7,
        momentum: float = 0.9,
        nesterov: bool = True,
        fragments: int = 1,
        topology: str | None = None,
        overlap: int = 0,
        alpha: float = 0.5,
    ) -> None:
        self.period, self.outer_lr, self.momentum, self.nesterov = period, outer_lr, momentum, nesterov
        self.fragments, self.topology, self.overlap, self.alpha = fragments, topology, overlap, alpha
        self.pending: list[tuple[int, np.ndarray, np.ndarray]] = []  # (due step, part, averaged D)
        self.theta: np.ndarray | None = None
        self.exchanges = 0

    def start(self, states: np.ndarray) -> None:
        self.theta = np.array(states, dtype=np.float64)
        self.velocity = np.zeros_like(self.theta)
        self.parts = np.array_split(np.arange(self.theta.shape[1]), self.fragments)
        self.graph = make_topology(self.topology, len(states)) if self.topology else None

    def after_step(self, step: int, states: np.ndarray) -> np.ndarray:
        """``states`` (workers x parameters) after the optimizer step of ``step``, changed in place and returned."""
        due = [p for p in self.pending if p[0] == step]
        self.pending = [p for p in self.pending if p[0] != step]
        for _, part, mixed in due:
            self.outer(part, mixed, states, self.alpha)
        for f, part in enumerate(self.parts):
            if (step + 1 + f * self.period // self.fragments) % self.period:
                continue
            if self.graph is None:
                mixed = self.theta[:, part] - states[:, part].mean(axis=0)
            else:
                mixed = self.theta[:, part] - self.graph.mixing_matrix(self.exchanges) @ states[:, part]
            self.exchanges += 1
            if self.overlap:
                self.pending.append((step + self.overlap, part, mixed))
            else:
                self.outer(part, mixed, states, 0.0)
        return states

    def outer(self, part: np.ndarray, mixed: np.ndarray, states: np.ndarray, alpha: float) -> None:
        """The outer step of ``part`` with pseudo-gradients ``mixed``; X <- alpha X + (1 - alpha) Theta there."""
        mu, lr = self.momentum, self.outer_lr
        velocity = self.velocity[:, part] = mu * self.velocity[:, part] + mixed
        self.theta[:, part] -= lr * (mixed + mu * velocity if self.nesterov else velocity)
        states[:, part] = alpha * states[:, part] + (1 - alpha) * self.theta[:, part]

    def finish(self, states: np.ndarray) -> np.ndarray:
        """``close``: the outer step still pending (overlap) applied to ``states`` as they are."""
        for _, part, mixed in self.pending:
            self.outer(part, mixed, states, self.alpha)
        self.pending = []
        return states

    def replay(self, starts: np.ndarray, grads: list[list[np.ndarray]], lr: float) -> np.ndarray:
        """Every worker's parameters after plain SGD steps with the recorded ``grads[rank][k]`` from ``starts``."""
        states = np.array(starts, dtype=np.float64)
        self.start(states)
        for k in range(len(grads[0])):
            states -= lr * np.stack([g[k] for g in grads])
            self.after_step(k, states)
        return states
