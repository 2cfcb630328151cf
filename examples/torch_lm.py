"""FAST with PyTorch: a GPT-2-style byte-level language model on Python's own standard library source, MPI ranks.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py examples/torch_lm.py --size tiny --strategy dpsgd:ring
    fast run -n 2 --strategy diloco:period=50 -m fast_examples.torch_lm --size small --epochs 4
    fast bench --framework lm -n 2 --strategies allreduce,dpsgd,diloco -- --size tiny

The model (``fast_examples.torch_gpt``) comes in three sizes (``--size``): ``tiny`` (2 layers, 64 wide: CI runs it
in seconds), ``small`` (6 layers, 384 wide: 10.8M parameters) and ``gpt2`` (GPT-2 small's shape and 124M
parameters). The corpus (``fast_examples.lm_data``) is the standard library's ``*.py`` text, bytes as tokens, every
20th file held out. Each rank trains on its own contiguous shard of the training text, on random windows of
``--seq`` bytes, with AdamW through ``fast.DistributedOptimizer``; ``--bf16`` runs forward and backward in bfloat16
autocast with float32 master weights (pair it with a strategy's ``compress=bf16`` for bfloat16 messages);
``--cosine`` decays the learning rate along a cosine to a tenth of it over the run's steps (the DiLoCo paper's
inner schedule, its warm-up left out).

``--epochs E`` is the job's shared budget: an epoch here is ``--steps-per-epoch`` batches on every rank (the corpus
is far larger than a run reads), so E epochs are E x steps x batch x ranks sequences (``fast_core.Budget``; ``fast
run --budget-samples/--budget-seconds`` replaces it). At each of this rank's epoch ends it scores its replica on
fixed held-out windows (loss in nats per byte, next-byte accuracy). At the end every rank takes the consensus model
(the average of all ranks' models) and rank 0 prints and records its validation loss, perplexity (e^loss, per
byte) and next-byte accuracy; ``fast bench`` ranks runs by that accuracy (its "test accuracy" column) and the
records carry the loss. Under ``fast run`` rank 0 also records the consensus model's validation loss and accuracy
over time ("consensus" records), from snapshots every ``--snapshot-every`` seconds.

Before building the model each rank checks that the size fits this machine's available memory with the ranks it
shares it with, and refuses with the estimate otherwise; a corpus path that is missing or empty gets one line.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import CosineAnnealingLR

import fast_torch as fast
from fast_core import Budget, Strategy, run_config
from fast_core.observers.snapshots import FOLDER as SNAPSHOTS
from fast_core.runtime.consensus_curve import attach_snapshots, record_consensus_curve
from fast_core.runtime.summaries import epoch_summary, spent_text
from fast_examples import lm_run
from fast_examples.lm_data import shard_tokens, validation_windows
from fast_examples.lm_data import windows as sample_windows
from fast_examples.torch_gpt import build_model, lm_loss


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: tuple[np.ndarray, np.ndarray], batch: int) -> tuple[float, float]:
    """(mean loss in nats per byte, next-byte accuracy) on the held-out windows, in float32."""
    first = next(model.parameters())
    model.eval()
    total, correct, count = 0.0, 0, 0
    for start in range(0, len(data[0]), batch):
        x = torch.from_numpy(data[0][start : start + batch]).to(first.device)
        y = torch.from_numpy(data[1][start : start + batch]).to(first.device)
        logits = model(x).float()
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        count += y.numel()
    model.train()
    return total / count, correct / count


def cosine_schedule(optimizer: torch.optim.Optimizer, budget: Budget, samples_per_step: int) -> CosineAnnealingLR:
    """The learning rate along a cosine from its value to a tenth of it over the budget's steps of one rank."""
    if budget.samples is None:
        raise SystemExit("torch_lm: --cosine needs the run's steps: give --epochs or --budget-samples, not seconds")
    steps = max(1, budget.samples // samples_per_step)
    return CosineAnnealingLR(optimizer, T_max=steps, eta_min=optimizer.param_groups[0]["lr"] / 10)


def train(
    strategy: str | Strategy = "dpsgd:ring",
    size: str = "tiny",
    epochs: int = 3,
    steps_per_epoch: int | None = None,
    batch_size: int | None = None,
    seq: int | None = None,
    lr: float | None = None,
    seed: int = 0,
    corpus: str | None = None,
    max_corpus_bytes: int | None = None,
    val_windows: int = 64,
    bf16: bool = False,
    ddp: bool = False,
    device: str = "cpu",
    snapshot_every: float = 0.5,
    cosine: bool = False,
    verbose: bool = True,
) -> dict[str, float]:
    """Train the LM with ``strategy`` on every rank (collective); returns the consensus model's
    ``{"val_loss", "perplexity", "val_accuracy"}``. None arguments take the size's defaults."""
    run = lm_run.plan(size, seq, batch_size, steps_per_epoch, lr, corpus, max_corpus_bytes)  # may refuse
    seq, batch_size, steps_per_epoch, lr, text = run.seq, run.batch, run.steps_per_epoch, run.lr, run.text
    engine = fast.init()
    own = shard_tokens(text.train, engine.rank, engine.size)
    held_out = validation_windows(text, seq, val_windows, seed)
    rng = np.random.default_rng([seed, engine.rank])
    global_epoch = steps_per_epoch * batch_size * engine.size  # sequences of one epoch of every rank
    config = run_config()
    configured = Budget.from_config(config)  # fast run's budget, if it gave one
    budget = None if configured is not None else Budget(samples=epochs * global_epoch)
    model = build_model(run.size, seed).to(device)
    if ddp:  # gloo on the MPI job's ranks; MASTER_ADDR and MASTER_PORT from the environment (fast run sets them)
        dist.init_process_group("gloo", rank=engine.rank, world_size=engine.size)
        strategy = Strategy()  # exchanges nothing, lockstep: DDP averages the gradients inside backward
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = cosine_schedule(optimizer, configured or budget, batch_size * engine.size) if cosine else None
    opt = fast.DistributedOptimizer(optimizer, model, strategy=strategy, budget=budget)
    worker = opt.fast_worker
    snapshots = attach_snapshots(worker, config.run_dir / SNAPSHOTS, snapshot_every) if config.run_dir else None
    worker.start()
    step_model = DistributedDataParallel(model) if ddp else model
    restarts = worker.claims.collective_passes(global_epoch, batch_size)  # FAST's restarts: where every rank takes part
    device_type = torch.device(device).type
    autocast = (lambda: torch.autocast(device_type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    if verbose and engine.rank == 0:
        shown = "DDP (gloo)" if ddp else worker.strategy
        print(run.header(engine.size, shown, epochs, "bf16 autocast" if bf16 else "float32", budget is None))
    for epoch in itertools.count(worker.step // steps_per_epoch):
        losses, spent = [], False
        for _ in range(steps_per_epoch):
            n = worker.claim_batch(batch_size)  # the whole batch, fewer on the job's last grant, 0 once spent
            if n == 0:
                spent = True
                break
            x, y = (torch.from_numpy(a[:n]).to(device) for a in sample_windows(own, seq, batch_size, rng))
            opt.zero_grad()
            with autocast():
                loss = lm_loss(step_model, x, y)
            loss.backward()
            opt.step()
            if schedule is not None:
                schedule.step()
            losses.append(loss.item())
            worker.records.step(loss=losses[-1], samples=n)
        if losses:  # lockstep ranks stop at the same step, so they all skip an empty last pass alike
            mean_loss, spread = epoch_summary(worker, float(np.mean(losses)))  # collective only if lockstep
            val_loss, val_accuracy = evaluate(model, held_out, batch_size)
            worker.records.epoch(loss=mean_loss, val_accuracy=val_accuracy, val_loss=val_loss)
            if restarts is None or epoch < restarts:
                worker.end_epoch(val_accuracy)  # FAST: every rank restarts from the best replica
            if verbose and engine.rank == 0:
                print(lm_run.epoch_line(epoch, mean_loss, val_loss, spread))
        if spent:
            break
    fast.average_model(model)  # closes the worker first (its last messages land), then the consensus model
    val_loss, val_accuracy = evaluate(model, held_out, batch_size)
    result = lm_run.result_of(val_loss, val_accuracy)
    worker.records.result(test_accuracy=val_accuracy, val_loss=val_loss, perplexity=result["perplexity"])
    if snapshots is not None:  # the consensus model over time: its loss, then its accuracy (for fast bench)
        record_consensus_curve(worker, snapshots, lambda: evaluate(model, held_out, batch_size)[0], "val_loss", True)
        record_consensus_curve(worker, snapshots, lambda: evaluate(model, held_out, batch_size)[1])
    if ddp:
        dist.destroy_process_group()
    spent = spent_text(worker, global_epoch)  # collective
    if verbose and engine.rank == 0:
        print(lm_run.result_line(result, worker.metrics.as_dict()))
        print(spent)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = lm_run.parser(__doc__.split("\n")[0])
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast, float32 master weights")
    parser.add_argument("--ddp", action="store_true", help="train with DistributedDataParallel (gloo) instead")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cosine", action="store_true", help="cosine learning-rate decay to a tenth over the run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lm_run.run("torch_lm", train, args, bf16=args.bf16, ddp=args.ddp, device=args.device, cosine=args.cosine)


if __name__ == "__main__":
    main()
