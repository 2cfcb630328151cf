"""The start-up check that every rank runs the same job: the same model layout and the same strategy.

Ranks that disagree silently corrupt the model (rank 0 on all-reduce and the others on local SGD trained to 0.65
accuracy instead of 1.00, exit 0), so ``Worker.start`` refuses to begin instead. One collective proves agreement:
each rank writes fixed-size digests (its layout's SHA-256 fingerprint and a digest of its canonical strategy string,
topology and options included) into its own row of a size x 48 byte table, and one sum-allreduce gives every rank
the whole table (each byte has one writer, so the sum is a gather). Only on a mismatch do more collectives follow,
to name the differing parameter (``check_same_layout``) or what each rank runs. Nothing is pickled.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fast_core.engine import Engine
from fast_core.errors import ConfigError
from fast_core.model.flat import FlatLayout, check_same_layout

_LAYOUT = 32  # bytes of FlatLayout.fingerprint()
_STRATEGY = 16  # bytes of the strategy string's digest
_TEXT = 160  # bytes of a strategy string shown in the error (longer ones are cut, marked with "...")


def check_same_setup(layout: FlatLayout, strategy: str, engine: Engine) -> None:
    """Raise on every rank when the ranks' layouts (ModelMismatchError) or strategy strings (ConfigError) differ.

    ``strategy`` is the canonical strategy string (``fast_core.strategies.canonical.canonical_strategy``). Costs one
    allreduce of size x 48 bytes when all agree.
    """
    table = np.zeros((engine.size, _LAYOUT + _STRATEGY), dtype=np.uint8)
    table[engine.rank, :_LAYOUT] = np.frombuffer(layout.fingerprint(), dtype=np.uint8)
    digest = hashlib.blake2b(strategy.encode(), digest_size=_STRATEGY).digest()
    table[engine.rank, _LAYOUT:] = np.frombuffer(digest, dtype=np.uint8)
    engine.allreduce(table)  # every row has one writer: the sum is an allgather
    if not (table[:, :_LAYOUT] == table[0, :_LAYOUT]).all():
        check_same_layout(layout, engine)  # collective on every rank: raises naming the first differing parameter
    if not (table[:, _LAYOUT:] == table[0, _LAYOUT:]).all():
        raise ConfigError(_strategies_message(strategy, engine))


def _strategies_message(strategy: str, engine: Engine) -> str:
    """Gather every rank's strategy string (one more allreduce, only on a mismatch) and say who runs what."""
    raw = strategy.encode()
    if len(raw) > _TEXT:
        raw = raw[: _TEXT - 3] + b"..."
    texts = np.zeros((engine.size, _TEXT), dtype=np.uint8)
    texts[engine.rank, : len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    engine.allreduce(texts)
    runs: dict[str, list[int]] = {}
    for rank in range(engine.size):
        runs.setdefault(texts[rank].tobytes().rstrip(b"\0").decode(errors="replace"), []).append(rank)
    groups = [f"{_ranks(ranks)} {'runs' if len(ranks) == 1 else 'run'} {text!r}" for text, ranks in runs.items()]
    return (
        f"{', '.join(groups)}; every rank must run the same strategy with the same options "
        "(check FAST_STRATEGY / FAST_TOPOLOGY or the strategy argument)"
    )


def _ranks(ranks: list[int]) -> str:
    """"rank 0", "ranks 1-3", "ranks 0, 2, 5-7"."""
    spans: list[str] = []
    start = previous = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        spans.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return f"rank {spans[0]}" if len(ranks) == 1 else f"ranks {', '.join(spans)}"
