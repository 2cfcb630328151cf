"""Issue 25 at 124M parameters: what every strategy holds in memory and adds to a step, on 2 ranks.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/at_scale.py --model lm --out docs/at_scale.md
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/at_scale.py --model resnet50 --out docs/at_scale.md
    python benchmarks/at_scale.py --model lm-tiny --strategies allreduce,dpsgd    # seconds: a smoke run

Models: ``lm`` is fast_examples.torch_lm's ``gpt2`` size (GPT-2 small's 124.4M parameters; sequence 64, batch 1,
AdamW), ``resnet50`` is fast_examples.resnet_model's ResNet-50 (25.6M; 224 x 224 images, batch 2, SGD with
momentum), ``lm-tiny`` the LM's tiny size for smoke runs. For each strategy one ``mpiexec -n 2`` launch (``--child``
mode of this file), so each has its own peak memory; in it, every rank:

1. memory: resident memory (``/proc/self/statm``) after the imports, after building the model (``model``), after 2
   plain steps (gradients and optimizer state: ``optimizer``; the step's transient peak over that:
   ``activations``), then wraps the optimizer with ``fast_torch.DistributedOptimizer(strategy)`` and takes 2 steps:
   the peak resident memory (``ru_maxrss``) above the plain steps' peak is what the strategy adds at its peak
   (``strategy peak``), the resident memory above the plain steps' is what it keeps (``strategy kept``). All as
   multiples of the model's parameter bytes; the largest rank's.
2. step time, interleaved: ``--repeats`` rounds of ``--steps`` steps each of the plain step (the same model and a
   second optimizer of the same kind, no FAST: the single-process step), DistributedDataParallel (gloo, the same
   module, that plain optimizer) and the strategy; every rank times each step, the medians of the slowest rank are
   reported. The strategy's extra time per step (its step's median minus the plain step's) is set against the time
   of ``np.copyto`` of the model's bytes (memcpy, median of 5, same process): "extra in memcpys" is how many
   model-sized copies the strategy's additions cost together. A third table splits them: the adapter's staging
   (tensors to and from the flat buffers), waiting on peers (the engine's wait counter) and the rest of the
   Worker's hooks (integrity checks, mixing, serialisation), each timed around those calls (``PieceClock``).

The parent prints and writes (``--out``, between markers) the tables. 2 ranks share the machine's cores, so a step
here includes the other rank's contention, as DDP's and the plain step's do.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from report import markers, write_section

HERE = Path(__file__).resolve()
RESULT = "RESULT "
STRATEGIES = "allreduce,localsgd,dpsgd,async,sgp,gossip,adpsgd,easgd,fast,ps,diloco,choco"
HOLDS = {
    "allreduce": "nothing: the gradient is averaged in place in the flat gradient buffer",
    "localsgd": "nothing: parameters are averaged in place every 4 steps",
    "dpsgd": "the parameters at the step's start, sent while the step mixes (1), and a receive buffer per neighbour",
    "async": "a mailbox: the staged and the outgoing message (2: it posts while one is in flight) and per neighbour "
    "the landing and the newest message (2)",
    "sgp": "the push-sum state [x, w] that is sent (1) and a receive buffer per in-neighbour",
    "gossip": "the pulled peer's parameters (1)",
    "adpsgd": "its published snapshot and the pair averages not yet applied (2), and the pair service's request, "
    "reply and their two receive buffers (4)",
    "easgd": "the center variable (a model copy) and the elastic difference",
    "fast": "a gradient mailbox: staged and outgoing (2), per neighbour up to 4 unread gradients and the landing one",
    "ps": "the parameters sent and their average (2), and the shard this rank serves",
    "diloco": "the parameters at the round's start, the outer momentum and the pseudo-gradient (3)",
    "choco": "the public copy x-hat of itself and of each neighbour, the difference and its encoded payloads",
}
"""What each strategy holds beside the model, from its design (the table shows what it measures)."""


def rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PieceClock:
    """Seconds spent in the strategy's pieces during the timed steps: the adapter's staging (framework tensors to
    and from the flat host buffers: ``params``, ``set_params``, ``grads``, ``set_grads``) and the Worker's hooks
    (``before_step``, ``after_step``: integrity checks, mixing, serialisation, and waiting on peers, which the
    engine's metrics count apart). Wraps the instances' methods; ``on`` is False outside the timed steps."""

    STAGING = ("params", "set_params", "grads", "set_grads")
    HOOKS = ("before_step", "after_step")

    def __init__(self, model: object, worker: object) -> None:
        self.on = False
        self.seconds = {"staging": 0.0, "hooks": 0.0}
        for name in self.STAGING:
            setattr(model, name, self._timed(getattr(model, name), "staging"))
        for name in self.HOOKS:
            setattr(worker, name, self._timed(getattr(worker, name), "hooks"))

    def _timed(self, method, piece: str):
        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                if self.on:
                    self.seconds[piece] += time.perf_counter() - began

        return timed


# the child: one strategy on every rank -----------------------------------------------------------------------------
def build(name: str):
    """(model, optimizer factory, batch factory, loss) of ``name``."""
    import numpy as np
    import torch

    if name.startswith("lm"):
        from fast_examples.lm_data import SIZES
        from fast_examples.torch_gpt import build_model, lm_loss

        size = SIZES["gpt2" if name == "lm" else "tiny"]
        seq, batch = (64, 1) if name == "lm" else (64, 8)
        model = build_model(size)
        rng = np.random.default_rng(0)

        def batch_of():
            rows = torch.from_numpy(rng.integers(0, 256, (batch, seq + 1)))
            return rows[:, :-1], rows[:, 1:]

        def optimizer(params):
            return torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)

        return model, optimizer, batch_of, lm_loss
    from fast_examples.resnet_model import build_resnet, synthetic_batch

    generator = torch.Generator().manual_seed(0)

    def resnet_loss(model, images, labels):
        return torch.nn.functional.cross_entropy(model(images), labels)

    def sgd(params):
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)

    return build_resnet("resnet50"), sgd, lambda: synthetic_batch(2, 224, 1000, generator), resnet_loss


def child(args: argparse.Namespace) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import fast_torch as fast

    torch.set_num_threads(1)
    engine = fast.init()
    base = rss()
    model, make_optimizer, batch_of, loss_of = build(args.model)
    built = rss()
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def step(optimizer, forward) -> float:
        x, y = batch_of()
        began = time.perf_counter()
        optimizer.zero_grad()
        loss_of(forward, x, y).backward()
        optimizer.step()
        return time.perf_counter() - began

    optimizer = make_optimizer(model.parameters())
    for _ in range(2):
        step(optimizer, model)
    after_plain, plain_peak = rss(), peak()
    # the same optimizer, hooked: its state stays, so what grows from here is the strategy's (and the flat buffers')
    hooked = fast.DistributedOptimizer(optimizer, model, strategy=args.strategy)
    worker = hooked.fast_worker
    worker.start()
    for _ in range(2):
        step(hooked, model)
    after_strategy, strategy_peak = rss(), peak()
    memory = [
        built - base,
        after_plain - built,
        plain_peak - after_plain,
        strategy_peak - plain_peak,
        after_strategy - after_plain,
    ]
    plain = make_optimizer(model.parameters())  # times the plain step below: the same kind, no FAST hooks
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getppid() % 1000))
    dist.init_process_group("gloo", rank=engine.rank, world_size=engine.size)
    ddp = DistributedDataParallel(model)
    times: dict[str, list[float]] = {"plain": [], "ddp": [], "strategy": []}
    sent_before, steps_before = worker.metrics.bytes_sent, worker.metrics.steps
    pieces = PieceClock(worker.context.model, worker)
    wait_before = worker.metrics.wait_seconds
    for _ in range(args.repeats):
        for system, optimizer, forward in (("plain", plain, model), ("ddp", plain, ddp), ("strategy", hooked, model)):
            engine.barrier()
            pieces.on = system == "strategy"
            times[system] += [step(optimizer, forward) for _ in range(args.steps)]
            pieces.on = False
    timed_steps = args.repeats * args.steps
    waited = (worker.metrics.wait_seconds - wait_before) / timed_steps
    staging = pieces.seconds["staging"] / timed_steps  # also inside the hooks: taken out of them below
    hooks = pieces.seconds["hooks"] / timed_steps
    sent = (worker.metrics.bytes_sent - sent_before) / max(1, worker.metrics.steps - steps_before)
    engine.barrier()
    worker.close()
    dist.destroy_process_group()
    source, target = np.ones(model_bytes // 4, np.float32), np.empty(model_bytes // 4, np.float32)
    copies = []
    for _ in range(5):
        began = time.perf_counter()
        np.copyto(target, source)
        copies.append(time.perf_counter() - began)
    mine = np.array(
        [
            *memory,
            *(statistics.median(times[k]) for k in ("plain", "ddp", "strategy")),
            statistics.median(copies),
            staging,
            waited,
            max(0.0, hooks - staging - waited),
        ],
        dtype=np.float64,
    )
    highest = mine.copy()
    engine.allreduce(highest, op="max")
    if engine.rank == 0:
        keys = ("model", "optimizer", "activations", "strategy_peak", "strategy_kept")
        row = {"strategy": args.strategy, "model_bytes": model_bytes, "bytes_sent_per_step": sent}
        row |= {k: highest[i] / model_bytes for i, k in enumerate(keys)}
        row |= {"plain_s": highest[5], "ddp_s": highest[6], "strategy_s": highest[7], "memcpy_s": highest[8]}
        row |= {"staging_s": highest[9], "wait_s": highest[10], "mixing_s": highest[11]}
        print(RESULT + json.dumps(row), flush=True)


# the parent: one launch per strategy, then the tables ---------------------------------------------------------------
def launch(strategy: str, args: argparse.Namespace) -> dict:
    beside = Path(sys.executable).parent / "mpiexec"
    command = [str(beside) if beside.exists() else "mpiexec", "-n", "2", sys.executable, "-m", "mpi4py", str(HERE)]
    command += ["--child", "--model", args.model, "--strategy", strategy]
    command += ["--steps", str(args.steps), "--repeats", str(args.repeats)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        return {"strategy": strategy, "error": f"exit {done.returncode}: {tail}"}
    return json.loads(lines[-1].removeprefix(RESULT))


def tables(rows: list[dict]) -> str:
    good = [r for r in rows if "error" not in r]
    memory = [
        "| strategy | model | gradients + optimizer | activations (peak) | strategy adds at peak | strategy keeps "
        "| what it holds beside the model |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    timing = [
        "| strategy | plain step ms | DDP step ms | strategy step ms | vs plain | vs DDP | extra ms/step "
        "| memcpy of the model ms | extra in memcpys | kB sent/step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    split = [
        "| strategy | staging ms | in memcpys | waiting on peers ms | checks, mixing, serialisation ms | in memcpys |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in good:
        name = r["strategy"].split(":")[0]
        memory.append(
            f"| `{r['strategy']}` | {r['model']:.2f} | {r['optimizer']:.2f} | {r['activations']:.2f} "
            f"| {r['strategy_peak']:.2f} | {r['strategy_kept']:.2f} | {HOLDS.get(name, '')} |"
        )
        extra = r["strategy_s"] - r["plain_s"]
        timing.append(
            f"| `{r['strategy']}` | {r['plain_s'] * 1e3:.0f} | {r['ddp_s'] * 1e3:.0f} | {r['strategy_s'] * 1e3:.0f} "
            f"| {r['strategy_s'] / r['plain_s']:.3f} | {r['strategy_s'] / r['ddp_s']:.3f} | {extra * 1e3:.0f} "
            f"| {r['memcpy_s'] * 1e3:.1f} | {extra / r['memcpy_s']:.1f} | {r['bytes_sent_per_step'] / 1e3:.0f} |"
        )
        if "staging_s" in r:  # rows measured before the split have none
            split.append(
                f"| `{r['strategy']}` | {r['staging_s'] * 1e3:.0f} | {r['staging_s'] / r['memcpy_s']:.1f} "
                f"| {r['wait_s'] * 1e3:.0f} | {r['mixing_s'] * 1e3:.0f} | {r['mixing_s'] / r['memcpy_s']:.1f} |"
            )
    failed = [f"- `{r['strategy']}` failed: {r['error'].splitlines()[-1]}" for r in rows if r.get("error")]
    model_mb = good[0]["model_bytes"] / 2**20 if good else 0
    return (
        f"Memory per rank, in multiples of the model's parameter bytes ({model_mb:.0f} MiB), the largest rank's:\n\n"
        + "\n".join(memory)
        + "\n\nStep time (medians, slowest rank; plain, DDP and the strategy interleaved in each launch):\n\n"
        + "\n".join(timing)
        + "\n\nThe strategy's pieces per step (means over the timed steps, largest rank's; staging is the adapter's "
        "copies between the framework's tensors and the flat host buffers, the rest is inside the Worker's hooks):\n\n"
        + "\n".join(split)
        + ("\n\n" + "\n".join(failed) if failed else "")
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("lm", "resnet50", "lm-tiny"), default="lm")
    parser.add_argument("--strategies", default=STRATEGIES, help="comma-separated strategy strings")
    parser.add_argument("--steps", type=int, default=3, help="steps per system and round")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of plain, DDP and the strategy")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one launch may take")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into (between markers)")
    parser.add_argument("--section", help="the markers' name in --out (default: the model's), to add rows apart")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    began = time.monotonic()
    rows = []
    for strategy in [s.strip() for s in args.strategies.split(",") if s.strip()]:
        rows.append(launch(strategy, args))
        print(
            f"{strategy}: {'failed' if 'error' in rows[-1] else 'done'} ({time.monotonic() - began:.0f} s)", flush=True
        )
        print(RESULT + json.dumps(rows[-1]), flush=True)  # the raw figures, kept in the log whatever follows
    command = " ".join(["python", "benchmarks/at_scale.py", *(argv if argv is not None else sys.argv[1:])])
    section = args.section or args.model
    text = (
        f"### {section}\n\n`{command}`: 2 ranks on {os.cpu_count()} CPU cores, {datetime.date.today()}, "
        f"{args.repeats} rounds of {args.steps} steps per system, {time.monotonic() - began:.0f} s in all.\n\n"
        f"{tables(rows)}\n"
    )
    print(text)
    if args.out:
        name = f"at_scale {section}"
        start, end = markers(name)
        write_section(args.out, name, f"{start}\n{text}{end}")


if __name__ == "__main__":
    main()
