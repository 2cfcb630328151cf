"""Neighbour exchange through FAST's MPIEngine against raw mpi4py, and mixing against np.copyto.

Exchange: every rank sends a flat float32 buffer to its right neighbour on a ring and receives one from its left
neighbour, once with ``comm.Sendrecv`` and once with ``engine.wait_all(engine.exchange(...))``, interleaved in the
same run. Mixing: the D-PSGD update (one ``fast_core.model.mixing.axpy`` for the self term, one per neighbour) against
``np.copyto`` of the same bytes, with tracemalloc checking that mixing allocates nothing per step.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py benchmarks/exchange.py --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI
from report import command_line, markers, write_section

import fast_core
from fast_core.model.mixing import axpy

MB = 10**6
START, END = markers("exchange")


@dataclass
class Timing:
    """Median seconds per iteration of a measurement and the bytes it moves."""

    seconds: float
    nbytes: int

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9


@dataclass
class ExchangeRow:
    size_mb: float
    repeats: int
    raw: Timing
    fast: Timing


@dataclass
class MixRow:
    size_mb: float
    k: int
    repeats: int
    mix: Timing
    copy: Timing
    peak_bytes: int | None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 10, 100], help="buffer sizes (MB = 1e6 B)")
    parser.add_argument("--repeats", type=int, help="timed iterations per size (default: fewer for larger sizes)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations before each measurement")
    parser.add_argument("--neighbours", type=int, nargs="+", default=[2, 4], help="k buffers mixed per step")
    parser.add_argument("--out", type=Path, help="Markdown file whose exchange section is written or replaced")
    return parser.parse_args(argv)


def default_repeats(size_mb: float) -> int:
    """About 1000 iterations for 1 MB, 200 for 10 MB, 40 for 100 MB: a default run takes well under a minute."""
    return int(min(1000, max(20, 1000 / size_mb**0.7)))


def float32_buffer(size_mb: float, fill: float) -> np.ndarray:
    """A float32 buffer of ``size_mb`` MB, written once so its pages exist before timing."""
    return np.full(int(size_mb * MB) // 4, fill, dtype=np.float32)


def slowest(comm: MPI.Comm, fn: Callable[[], None]) -> float:
    """Seconds ``fn`` took on the slowest rank, after a barrier so all ranks start together."""
    comm.Barrier()
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    return comm.allreduce(elapsed, op=MPI.MAX)


def interleaved(comm: MPI.Comm, fns: Sequence[Callable[[], None]], repeats: int, warmup: int) -> list[float]:
    """Median slowest-rank seconds of each function, run A B A B ... so noise hits all of them alike."""
    for _ in range(warmup):
        for fn in fns:
            slowest(comm, fn)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, samples, strict=True):
            times.append(slowest(comm, fn))
    return [statistics.median(times) for times in samples]


def check_received(recv: np.ndarray, expected: float, what: str) -> None:
    if recv[0] != expected or recv[-1] != expected:
        raise RuntimeError(f"{what} delivered {recv[0]}..{recv[-1]}, expected {expected}")


def bench_exchange(comm: MPI.Comm, size_mb: float, repeats: int, warmup: int) -> ExchangeRow:
    """Ring exchange (send right, receive from left) of one buffer: raw Sendrecv vs MPIEngine, same bytes."""
    engine = fast_core.mpi_engine(comm, timeout=fast_core.run_config().timeout)
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    send, recv = float32_buffer(size_mb, rank + 1), float32_buffer(size_mb, 0)

    def raw() -> None:
        comm.Sendrecv(send, dest=right, sendtag=0, recvbuf=recv, source=left, recvtag=0)

    def fast() -> None:
        engine.wait_all(engine.exchange(send, [right], [recv], [left]))

    for name, fn in (("Sendrecv", raw), ("MPIEngine.exchange", fast)):
        recv[:] = 0
        fn()
        check_received(recv, left + 1, name)
    raw_s, fast_s = interleaved(comm, [raw, fast], repeats, warmup)
    return ExchangeRow(size_mb, repeats, Timing(raw_s, send.nbytes), Timing(fast_s, send.nbytes))


def dpsgd_mix(params: np.ndarray, start: np.ndarray, neighbours: Sequence[np.ndarray]) -> None:
    """What D-PSGD does after a step with uniform weights: one axpy for the self term, one per neighbour."""
    weight = 1.0 / (len(neighbours) + 1)
    axpy(weight - 1.0, start, params)
    for buf in neighbours:
        axpy(weight, buf, params)


def tracemalloc_sees_numpy() -> bool:
    """True when tracemalloc reports NumPy array data (so a zero peak really means no allocation)."""
    tracemalloc.start()
    try:
        probe = np.ones(MB, dtype=np.uint8)
        seen = tracemalloc.get_traced_memory()[1] >= probe.nbytes
    finally:
        tracemalloc.stop()
    return seen


def peak_allocated(fn: Callable[[], None], calls: int) -> int:
    """Peak bytes allocated by Python and NumPy, above what was live before, while calling ``fn`` repeatedly."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for _ in range(calls):
            fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def bench_mixing(
    comm: MPI.Comm, size_mb: float, ks: Sequence[int], repeats: int, warmup: int, track: bool
) -> list[MixRow]:
    """Mixing k neighbour buffers into the parameters vs np.copyto of the same k + 1 buffers' bytes."""
    rng = np.random.default_rng(comm.Get_rank())
    params, start, dst = (float32_buffer(size_mb, 0) for _ in range(3))
    params[:] = rng.standard_normal(params.size, dtype=np.float32)
    start[:] = params
    neighbours = [float32_buffer(size_mb, i + 1) for i in range(max(ks))]
    rows = []
    for k in ks:
        inputs = [start, *neighbours[:k]]

        def mix(inputs: list[np.ndarray] = inputs) -> None:
            dpsgd_mix(params, inputs[0], inputs[1:])

        def copy(inputs: list[np.ndarray] = inputs) -> None:
            for buf in inputs:
                np.copyto(dst, buf)

        mix_s, copy_s = interleaved(comm, [mix, copy], repeats, warmup)
        peak = comm.allreduce(peak_allocated(mix, 3), op=MPI.MAX) if track else None
        nbytes = len(inputs) * params.nbytes
        rows.append(MixRow(size_mb, k, repeats, Timing(mix_s, nbytes), Timing(copy_s, nbytes), peak))
    return rows


def fmt_size(size_mb: float) -> str:
    return f"{size_mb:g} MB"


def exchange_table(rows: Sequence[ExchangeRow]) -> str:
    lines = [
        "| buffer | iterations | raw Sendrecv ms | FAST exchange ms | raw GB/s | FAST GB/s | FAST / raw | ≤ 1.1x |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in rows:
        ratio = r.fast.seconds / r.raw.seconds
        lines.append(
            f"| {fmt_size(r.size_mb)} | {r.repeats} | {r.raw.seconds * 1e3:.3f} | {r.fast.seconds * 1e3:.3f} | "
            f"{r.raw.gbps:.2f} | {r.fast.gbps:.2f} | {ratio:.2f}x | {'yes' if ratio <= 1.1 else 'no'} |"
        )
    return "\n".join(lines)


def mixing_table(rows: Sequence[MixRow]) -> str:
    lines = [
        "| buffer | k | iterations | axpy mix ms | np.copyto ms | mix GB/s | copyto GB/s | mix / copyto "
        "| peak bytes allocated while mixing |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        peak = "not measurable" if r.peak_bytes is None else f"{r.peak_bytes:,}"
        lines.append(
            f"| {fmt_size(r.size_mb)} | {r.k} | {r.repeats} | {r.mix.seconds * 1e3:.3f} | {r.copy.seconds * 1e3:.3f} "
            f"| {r.mix.gbps:.2f} | {r.copy.gbps:.2f} | {r.mix.seconds / r.copy.seconds:.2f}x | {peak} |"
        )
    return "\n".join(lines)


def section(exchange: Sequence[ExchangeRow], mixing: Sequence[MixRow], ranks: int) -> str:
    """The Markdown section this benchmark owns, markers included."""
    library = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    today = datetime.date.today().isoformat()
    return "\n".join(
        [
            START,
            "## Neighbour exchange and mixing (`benchmarks/exchange.py`)",
            "",
            f"`{command_line(ranks)}`",
            "",
            f"{library}, {ranks} ranks, {os.cpu_count()} CPUs, NumPy {np.__version__}, {today}.",
            "",
            "**Exchange.** Each rank sends a float32 buffer to rank + 1 and receives one from rank - 1 (a ring), "
            "with raw `comm.Sendrecv` and with `engine.wait_all(engine.exchange(...))` on `fast_core.mpi_engine()`. "
            "Times are medians over the iterations of the slowest rank's time, after a barrier; GB/s is bytes sent "
            "per rank per second (MB = 10^6 bytes). Goal: FAST within 1.1x of raw MPI.",
            "",
            exchange_table(exchange),
            "",
            "**Mixing.** The D-PSGD update of the parameter buffer from its own start-of-step copy and k neighbour "
            "buffers (k + 1 calls of `fast_core.model.mixing.axpy`) against `np.copyto` of the same k + 1 buffers, all "
            "ranks at once. GB/s counts the k + 1 input buffers per second. Peak bytes allocated is tracemalloc's "
            "peak (Python objects and NumPy data) over 3 mixing calls, maximum over ranks: the goal is none per step.",
            "",
            mixing_table(mixing),
            END,
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        sys.exit("run with at least 2 ranks: mpiexec -n 2 python -m mpi4py benchmarks/exchange.py")
    root = comm.Get_rank() == 0
    track = comm.allreduce(tracemalloc_sees_numpy(), op=MPI.LAND)
    exchange, mixing = [], []
    for size_mb in args.sizes_mb:
        repeats = args.repeats or default_repeats(size_mb)
        exchange.append(bench_exchange(comm, size_mb, repeats, args.warmup))
        mixing += bench_mixing(comm, size_mb, args.neighbours, repeats, args.warmup, track)
        if root:
            print(f"{fmt_size(size_mb)} done", file=sys.stderr, flush=True)
    if root:
        text = section(exchange, mixing, comm.Get_size())
        print(text)
        if args.out:
            write_section(args.out, "exchange", text)
            print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
