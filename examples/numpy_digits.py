"""FAST with no deep-learning framework: softmax regression on scikit-learn's real 8x8 digits.

    mpiexec -n 4 python -m mpi4py examples/numpy_digits.py --strategy dpsgd:ring

Each rank trains on its own shard and averages parameters with its ring neighbours only (D-PSGD); rank 0 reports
the mean loss of all ranks, their consensus distance, and the test accuracy of the averaged model.
"""

from __future__ import annotations

import argparse

import numpy as np

import fast_core
from fast_core.datasets import batches, digits, shard_indices, train_test_split
from fast_core.numpy_model import SGD, SoftmaxRegression


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", default="dpsgd:ring", help="e.g. allreduce, dpsgd:ring, dpsgd:exp1")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()

    engine = fast_core.init()
    x, y = digits()
    x_train, y_train, x_test, y_test = train_test_split(x, y, test_fraction=0.2, seed=0)
    mine = shard_indices(len(y_train), engine.rank, engine.size, seed=0, drop_last=True)
    x_train, y_train = x_train[mine], y_train[mine]

    model = SoftmaxRegression(x.shape[1], 10, optimizer=SGD(args.lr), seed=engine.rank)
    worker = fast_core.Worker(model, args.strategy, engine).start()
    if engine.rank == 0:
        print(f"{engine.size} workers, strategy {worker.strategy}, {len(y_train)} training digits each")
    for epoch in range(args.epochs):
        losses = []
        for xb, yb in batches(x_train, y_train, args.batch_size, epoch=epoch, seed=engine.rank):
            losses.append(model.compute_gradients(xb, yb))
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
        loss = np.array([np.mean(losses)])
        engine.allreduce(loss)
        spread = worker.consensus_distance()
        if engine.rank == 0 and (epoch % 5 == 4 or epoch == args.epochs - 1):
            print(f"epoch {epoch + 1:3d}  loss {loss[0] / engine.size:.4f}  consensus distance {spread:.2e}")
    worker.close()
    accuracy = model.accuracy(x_test, y_test, worker.average_params())
    metrics = worker.metrics.as_dict()
    if engine.rank == 0:
        print(
            f"test accuracy of the averaged model: {accuracy:.4f}  "
            f"({metrics['steps']} steps, {metrics['bytes_sent'] / 1e6:.2f} MB sent by rank 0)"
        )


if __name__ == "__main__":
    main()
