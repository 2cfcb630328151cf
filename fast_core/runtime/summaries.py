"""Numbers a script prints or records about its job from its Worker: an epoch's summary, how the budget was spent.
Both are collectives over the group, so a lost rank is survived (``Group.collective``)."""

from __future__ import annotations

import numpy as np

from fast_core.runtime.worker import Worker


def epoch_summary(worker: Worker, loss: float) -> tuple[float, float | None]:
    """An epoch's loss averaged over ranks and the consensus distance, for synchronous strategies; for asynchronous
    ones this rank's own loss and None.

    Both numbers are collectives: under an asynchronous strategy they would hold every rank to the slowest one's
    pace once an epoch, undoing what the strategy is for (a straggler would set everyone's speed).
    """
    if not worker.strategy.lockstep:
        return loss, None
    total = np.array([loss], dtype=np.float64)
    worker.group.collective(lambda: worker.engine.allreduce(total))  # survives a lost rank under --fault-tolerant
    return float(total[0]) / worker.engine.size, worker.group.consensus_distance()


def spent_text(worker: Worker, global_epoch: int) -> str:
    """Collective, after ``close()``: one line on how the job spent its budget (the job's samples, in global epochs
    of ``global_epoch`` samples; rank 0's share; every rank's steps, gathered by one allreduce), for the examples'
    last output. After a lost rank the job's samples are the survivors' (the budget was finished by them), and the
    line says so, lest it read as a budget left unfinished."""

    def gather() -> np.ndarray:
        steps = np.zeros(worker.engine.size, dtype=np.int64)
        steps[worker.engine.rank] = worker.step
        worker.engine.allreduce(steps)  # after close: no rank waits mid-training
        return steps

    steps = worker.group.collective(gather)
    job, mine = worker.metrics.job_samples, worker.metrics.samples
    lost = sorted({rank for change in worker.group.recoveries for rank in change.lost})
    return (
        f"budget spent: {job} samples trained by the job ({job / global_epoch:.2f} global epochs), {mine} of them by "
        f"rank {worker.engine.rank}; steps per rank {steps.tolist()}"
        + (f"; not counted: what the lost rank(s) {lost} trained before they were lost" if lost else "")
    )
