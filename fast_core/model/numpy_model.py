"""A softmax-regression model in NumPy that implements the adapter contract.

It lets the core be used, tested and simulated end to end with no deep-learning framework, and it is the
reference against which the adapters' numbers are checked.
"""

from __future__ import annotations

import numpy as np

from fast_core.model.flat import FlatLayout


class SGD:
    """Plain SGD on a flat buffer: x <- x - lr * g."""

    def __init__(self, lr: float = 0.1) -> None:
        self.lr = lr

    def step(self, params: np.ndarray, grad: np.ndarray) -> None:
        params -= self.lr * grad

    def reset(self) -> None:
        """SGD keeps no state."""


class Momentum:
    """Heavy-ball SGD on a flat buffer: v <- beta v + g; x <- x - lr v (torch.optim.SGD's momentum, no dampening)."""

    def __init__(self, lr: float = 0.1, beta: float = 0.9) -> None:
        self.lr = lr
        self.beta = beta
        self.velocity: np.ndarray | None = None

    def step(self, params: np.ndarray, grad: np.ndarray) -> None:
        self.velocity = grad.copy() if self.velocity is None else self.beta * self.velocity + grad
        params -= self.lr * self.velocity

    def reset(self) -> None:
        self.velocity = None


class AdaGrad:
    """AdaGrad on a flat buffer: a stateful optimizer, as FAST's published setup used."""

    def __init__(self, lr: float = 0.01, eps: float = 1e-10, initial_accumulator: float = 0.0) -> None:
        self.lr = lr
        self.eps = eps
        self.initial_accumulator = initial_accumulator
        self.sum_sq: np.ndarray | None = None

    def step(self, params: np.ndarray, grad: np.ndarray) -> None:
        if self.sum_sq is None:
            self.sum_sq = np.full_like(params, self.initial_accumulator)
        self.sum_sq += grad * grad
        params -= self.lr * grad / (np.sqrt(self.sum_sq) + self.eps)

    def reset(self) -> None:
        self.sum_sq = None


def cross_entropy(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of softmax(``logits``) against labels ``y``, and its gradient with respect to the logits
    (``logits`` is overwritten)."""
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    n = len(y)
    loss = -float(np.mean(np.log(p[np.arange(n), y] + 1e-12)))
    p[np.arange(n), y] -= 1.0
    p /= n
    return loss, p


class FlatModel:
    """A NumPy model whose parameters and gradients are each one flat buffer of ``layout``: the adapter contract
    and the optimizer plumbing shared by the models below."""

    def __init__(self, layout: FlatLayout, optimizer=None) -> None:
        self.layout = layout
        self._params = self.layout.empty()
        self._grads = np.zeros_like(self._params)
        self.optimizer = optimizer if optimizer is not None else SGD()

    # adapter contract: the buffers are the model's own storage, so these are views ---------------------------
    def params(self) -> np.ndarray:
        return self._params

    def set_params(self, flat: np.ndarray) -> None:
        if flat is not self._params:
            np.copyto(self._params, flat)

    def grads(self) -> np.ndarray:
        return self._grads

    def set_grads(self, flat: np.ndarray) -> None:
        if flat is not self._grads:
            np.copyto(self._grads, flat)

    def apply_gradient(self, flat_grad: np.ndarray) -> None:
        self.optimizer.step(self._params, flat_grad)

    def reset_optimizer(self) -> None:
        """Forget optimizer state (FAST's restart from the best replica may ask for it)."""
        self.optimizer.reset()

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """AdaGrad's sums as a named array ({} for SGD): what a replacement of a lost rank takes from a live one."""
        sums = getattr(self.optimizer, "sum_sq", None)
        return {} if sums is None else {"sum_sq": sums}

    def load_optimizer_state(self, arrays: dict[str, np.ndarray]) -> None:
        if "sum_sq" in arrays and hasattr(self.optimizer, "sum_sq"):
            self.optimizer.sum_sq = np.array(arrays["sum_sq"], copy=True)

    def optimizer_step(self) -> None:
        """One step of the model's optimizer with its own gradients."""
        self.optimizer.step(self._params, self._grads)


class SoftmaxRegression(FlatModel):
    """Multinomial logistic regression: weights (features x classes) and bias, in one flat buffer."""

    def __init__(self, n_features: int, n_classes: int, optimizer=None, seed: int = 0, dtype: str = "float64"):
        layout = FlatLayout([("weight", (n_features, n_classes), dtype), ("bias", (n_classes,), dtype)])
        super().__init__(layout, optimizer)
        rng = np.random.default_rng(seed)
        self._params[:] = rng.normal(0.0, 0.01, self.layout.size)
        views = self.layout.unpack(self._params)
        self.weight, self.bias = views["weight"], views["bias"]

    def logits(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weight + self.bias

    def compute_gradients(self, x: np.ndarray, y: np.ndarray) -> float:
        """Fill the gradient buffer with d(mean cross-entropy)/d(params) on a batch; return the loss."""
        loss, p = cross_entropy(self.logits(x), y)
        grads = self.layout.unpack(self._grads)
        np.matmul(x.T, p, out=grads["weight"])
        np.sum(p, axis=0, out=grads["bias"])
        return loss

    def accuracy(self, x: np.ndarray, y: np.ndarray, params: np.ndarray | None = None) -> float:
        """Fraction of correct predictions, with the model's parameters or another flat buffer of its layout."""
        views = self.layout.unpack(self._params if params is None else params)
        return float(np.mean(np.argmax(x @ views["weight"] + views["bias"], axis=1) == y))


class MLP(FlatModel):
    """One hidden layer of ReLUs, then softmax: a model with a hidden layer for simulations that need more than a
    linear one (64 inputs, 128 hidden, 10 classes: 9,610 parameters, the 10k-parameter model of ``fast simulate``)."""

    def __init__(
        self, n_features: int, hidden: int, n_classes: int, optimizer=None, seed: int = 0, dtype: str = "float64"
    ):
        shapes = [("w1", (n_features, hidden)), ("b1", (hidden,)), ("w2", (hidden, n_classes)), ("b2", (n_classes,))]
        super().__init__(FlatLayout([(name, shape, dtype) for name, shape in shapes]), optimizer)
        rng = np.random.default_rng(seed)
        views = self.layout.unpack(self._params)
        views["w1"][:] = rng.normal(0.0, np.sqrt(2.0 / n_features), (n_features, hidden))  # He initialisation
        views["w2"][:] = rng.normal(0.0, np.sqrt(1.0 / hidden), (hidden, n_classes))
        views["b1"][:] = 0.0
        views["b2"][:] = 0.0

    def _forward(self, x: np.ndarray, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        views = self.layout.unpack(params)
        hidden = np.maximum(x @ views["w1"] + views["b1"], 0.0)
        return hidden, hidden @ views["w2"] + views["b2"]

    def compute_gradients(self, x: np.ndarray, y: np.ndarray) -> float:
        """Fill the gradient buffer with d(mean cross-entropy)/d(params) on a batch; return the loss."""
        hidden, z = self._forward(x, self._params)
        loss, p = cross_entropy(z, y)
        views, grads = self.layout.unpack(self._params), self.layout.unpack(self._grads)
        np.matmul(hidden.T, p, out=grads["w2"])
        np.sum(p, axis=0, out=grads["b2"])
        back = (p @ views["w2"].T) * (hidden > 0)
        np.matmul(x.T, back, out=grads["w1"])
        np.sum(back, axis=0, out=grads["b1"])
        return loss

    def accuracy(self, x: np.ndarray, y: np.ndarray, params: np.ndarray | None = None) -> float:
        """Fraction of correct predictions, with the model's parameters or another flat buffer of its layout."""
        _, z = self._forward(x, self._params if params is None else params)
        return float(np.mean(np.argmax(z, axis=1) == y))
