"""What the torch and JAX language-model examples share besides the corpus: their command line, the checks before a
run (size, corpus, memory: every rank refuses alike, before any collective) and the lines they print."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

from fast_core import local_size
from fast_core.strategies.spec import strategy_from_environment
from fast_examples.lm_data import (
    CI_CORPUS_BYTES,
    LR,
    SIZES,
    STEPS_PER_EPOCH,
    Corpus,
    CorpusError,
    Size,
    check_fits,
    load_corpus,
)


@dataclass(frozen=True)
class Plan:
    """One run's shape, the size's defaults filled in, and its text."""

    size: Size
    seq: int
    batch: int
    steps_per_epoch: int
    lr: float
    text: Corpus

    def header(self, ranks: int, strategy: object, epochs: int, precision: str, budget_given: bool) -> str:
        return (
            f"{ranks} workers, strategy {strategy}, size {self.size.name} ({self.size.parameters() / 1e6:.2f}M "
            f"parameters), sequence {self.seq}, batch {self.batch}, {precision}; {self.text.describe()}; budget "
            f"{epochs} epochs of {self.steps_per_epoch} steps per rank"
            + (" (fast run's budget replaces it)" if budget_given else "")
        )


def plan(
    size: str,
    seq: int | None = None,
    batch: int | None = None,
    steps_per_epoch: int | None = None,
    lr: float | None = None,
    corpus: str | None = None,
    max_corpus_bytes: int | None = None,
) -> Plan:
    """The run's shape and text; raises CorpusError or MemoryError (with the estimate) when it cannot run here."""
    shape = SIZES[size]
    seq, batch = seq or shape.seq, batch or shape.batch
    if seq > shape.context:
        raise CorpusError(f"--seq {seq}: size {size} has {shape.context} positions")
    if max_corpus_bytes is None and size == "tiny" and corpus is None:
        max_corpus_bytes = CI_CORPUS_BYTES
    text = load_corpus(corpus, max_corpus_bytes)
    refusal = check_fits(shape, seq, batch, local_size())
    if refusal:
        raise MemoryError(refusal)
    return Plan(shape, seq, batch, steps_per_epoch or STEPS_PER_EPOCH[size], lr or LR[size], text)


def epoch_line(epoch: int, loss: float, val_loss: float, spread: float | None) -> str:
    spread_text = "n/a" if spread is None else f"{spread:.2e}"
    return (
        f"epoch {epoch + 1:3d}  loss {loss:.4f}  val. loss {val_loss:.4f} (rank 0's replica)  "
        f"consensus distance {spread_text}"
    )


def result_of(val_loss: float, val_accuracy: float) -> dict[str, float]:
    return {"val_loss": val_loss, "perplexity": math.exp(val_loss), "val_accuracy": val_accuracy}


def result_line(result: dict[str, float], metrics: dict) -> str:
    return (
        f"consensus model: validation loss {result['val_loss']:.4f} nats/byte, perplexity {result['perplexity']:.3f}, "
        f"next-byte accuracy {result['val_accuracy']:.4f}  ({metrics['steps']} steps, "
        f"{metrics['bytes_sent'] / 1e6:.2f} MB sent by rank 0)"
    )


def parser(description: str) -> argparse.ArgumentParser:
    """The options both examples take; each adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--strategy", help="e.g. allreduce, dpsgd:ring, diloco:period=50 (default: fast run's)")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--epochs", type=int, default=3, help="the job's budget in epochs of --steps-per-epoch")
    p.add_argument("--steps-per-epoch", type=int, help="batches per rank in an epoch (default: the size's)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default: the size's)")
    p.add_argument("--seq", type=int, help="bytes per sequence (default: the size's)")
    p.add_argument("--lr", type=float, help="AdamW learning rate (default: the size's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", help="a text file or folder instead of the standard library's source")
    p.add_argument("--max-corpus-bytes", type=int, help="read at most this much text (tiny: 4 MB)")
    p.add_argument("--val-windows", type=int, default=64, help="held-out sequences each evaluation scores")
    p.add_argument("--snapshot-every", type=float, default=0.5, help="seconds between consensus snapshots")
    return p


def run(name: str, train: Callable[..., object], args: argparse.Namespace, **own: object) -> None:
    """``train(...)`` with the shared options and the example's ``own``; a bad corpus or a size that does not fit
    ends every rank with one line (they are refused before any collective)."""
    try:
        train(
            strategy=args.strategy or strategy_from_environment(default="dpsgd:ring"),
            size=args.size,
            epochs=args.epochs,
            steps_per_epoch=args.steps_per_epoch,
            batch_size=args.batch_size,
            seq=args.seq,
            lr=args.lr,
            seed=args.seed,
            corpus=args.corpus,
            max_corpus_bytes=args.max_corpus_bytes,
            val_windows=args.val_windows,
            snapshot_every=args.snapshot_every,
            **own,
        )
    except (CorpusError, MemoryError) as error:
        sys.exit(f"{name}: {error}")
