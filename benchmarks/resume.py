"""A job resumed from checkpoints on other numbers of ranks against the same job uninterrupted: the consensus
model's test accuracy of both, side by side, interleaved, medians of repeats (issue 13: within 0.5 point).

Softmax regression on the digits (NumPy, fast_core.runtime.checkpoint), a shared sample budget of ``--epochs`` global
epochs: uninterrupted on 4 ranks, and as three legs of a third each, 4 ranks -> checkpoint -> 2 ranks -> checkpoint
-> 8 ranks, each leg its own mpiexec launch, the budget carried by the checkpoint.

    python benchmarks/resume.py --strategies allreduce,async:ring --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fast_core.grammar import split_specs

BATCH, LR = 32, 0.1


def leg(strategy: str, budget: int, load: str, save: str) -> None:
    """One launch (under mpiexec): load ``load`` (unless "-"), train until the job has spent ``budget`` samples,
    save ``save``; rank 0 prints the consensus model's test accuracy and the job's samples as one JSON line."""
    from fast_core import Budget, Worker, init
    from fast_core.data.datasets import batches, example_task, shard_indices
    from fast_core.model.numpy_model import SoftmaxRegression
    from fast_core.runtime import checkpoint

    engine = init()
    task = example_task("digits")
    x, y = task.train
    model = SoftmaxRegression(x.shape[1], 10, seed=engine.rank)
    model.optimizer.lr = LR
    worker = Worker(model, strategy, engine, observers=[], budget=Budget(samples=budget))
    worker.start()
    if load != "-":
        checkpoint.load(load, worker)
    shard = shard_indices(len(y), engine.rank, engine.size)
    epoch = 0
    while True:
        for xb, yb in batches(x[shard], y[shard], BATCH, epoch=epoch, seed=engine.rank + 100 * worker.step):
            granted = worker.claim_batch(BATCH)
            if granted == 0:
                break
            model.compute_gradients(xb[:granted], yb[:granted])
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
        else:
            epoch += 1
            continue
        break
    worker.close()
    checkpoint.save(save, worker)
    consensus = worker.group.average_params()
    if engine.rank == 0:
        spent = worker.claims.samples_before + worker.metrics.job_samples
        print(json.dumps({"accuracy": model.accuracy(*task.test, params=consensus), "samples": spent}), flush=True)


def launch(ranks: int, strategy: str, budget: int, load: str, save: str) -> dict:
    command = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "mpi4py", __file__, "leg", strategy, str(budget)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*command, load, save], capture_output=True, text=True, timeout=600, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategies", default="allreduce,async:ring")
    parser.add_argument("--epochs", type=int, default=30, help="global epochs of the digits training set")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    total = args.epochs * 1293  # the digits training split: 1,293 samples
    rows = []
    for strategy in split_specs(args.strategies):
        whole, resumed, samples = [], [], []
        for _ in range(args.repeats):  # interleaved: one uninterrupted, one resumed, again
            folder = Path(tempfile.mkdtemp(prefix="fast-resume-"))
            whole.append(launch(4, strategy, total, "-", str(folder / "whole.ckpt"))["accuracy"])
            first = launch(4, strategy, total // 3, "-", str(folder / "a.ckpt"))
            second = launch(2, strategy, 2 * total // 3, str(folder / "a.ckpt"), str(folder / "b.ckpt"))
            third = launch(8, strategy, total, str(folder / "b.ckpt"), str(folder / "c.ckpt"))
            resumed.append(third["accuracy"])
            samples.append((first["samples"], second["samples"], third["samples"]))
            print(
                f"{strategy}: uninterrupted {whole[-1]:.4f}, resumed 4->2->8 {resumed[-1]:.4f}, samples {samples[-1]}",
                flush=True,
            )
        gap = statistics.median(whole) - statistics.median(resumed)
        rows.append(
            f"| {strategy} | {statistics.median(whole):.4f} | {statistics.median(resumed):.4f} | "
            f"{gap * 100:+.2f} | {samples[-1][2]} of {total} |"
        )
    print("\n| strategy | uninterrupted (4 ranks) | resumed 4 -> 2 -> 8 | points lost | samples trained |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "leg":
        leg(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        main()
