"""The language-model examples' text, model sizes and memory check: NumPy only, shared by torch_lm and jax_lm.

The corpus is the source text of Python's own standard library (every ``*.py`` file under
``sysconfig.get_paths()["stdlib"]``, installed packages left out): it is on every machine that runs these examples,
needs no download and no tokenizer (bytes are the tokens), is real text written by many people over 30 years (about
30 MB for CPython 3.11), and its file order can be made the same on every rank (sorted relative paths). Every 20th
file in that order is held out for validation, so no file is in both splits. ``--corpus PATH`` takes any other
text file or folder of ``*.py``/``*.txt``/``*.md`` files instead. The corpus depends on the Python version; the
examples print its size and digest so runs can be compared.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HELD_OUT_EVERY = 20
"""Every 20th file (sorted order) is validation text: 5% of the files."""
SUFFIXES = (".py", ".txt", ".md", ".rst")
SKIPPED = {"site-packages", "dist-packages", "__pycache__"}
VOCAB = 256
"""Byte-level tokens."""


class CorpusError(ValueError):
    """A corpus path that does not exist or holds no text: one line for the user."""


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray  # uint8 token stream (files joined, each followed by a 0 byte as a separator)
    validation: np.ndarray
    files: int
    source: str
    digest: str  # sha256 of the whole text, first 12 hex digits: the same corpus gives the same digest

    def describe(self) -> str:
        return (
            f"corpus {self.source}: {self.files} files, {len(self.train) / 1e6:.1f} MB training text, "
            f"{len(self.validation) / 1e6:.2f} MB held out (every {HELD_OUT_EVERY}th file), sha256 {self.digest}"
        )


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(path: Path) -> list[Path]:
    """The text files of ``path`` (a file, or a folder searched recursively), in sorted relative-path order."""
    if not path.exists():
        raise CorpusError(f"corpus {path}: no such file or folder")
    if path.is_file():
        return [path]
    found = [
        p
        for p in path.rglob("*")
        if p.suffix in SUFFIXES and p.is_file() and not SKIPPED.intersection(p.relative_to(path).parts)
    ]
    return sorted(found, key=lambda p: p.relative_to(path).as_posix())


def load_corpus(path: str | os.PathLike | None = None, max_bytes: int | None = None) -> Corpus:
    """The corpus split by file: the standard library's source when ``path`` is None. ``max_bytes`` stops reading
    once that much text is in (CI's small runs need no more); the held-out files are taken among those read."""
    root = stdlib_root() if path is None else Path(path)
    files = corpus_files(root)
    train, validation, total, digest = [], [], 0, hashlib.sha256()
    for index, file in enumerate(files):
        text = file.read_bytes() + b"\0"
        digest.update(text)
        (validation if index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else train).append(text)
        total += len(text)
        if max_bytes is not None and total >= max_bytes and validation:
            files = files[: index + 1]
            break
    if total <= len(files) or not train:  # only separators: every file empty
        raise CorpusError(f"corpus {root}: no text in its {len(files)} file(s) ({', '.join(SUFFIXES)})")
    if not validation:  # one or few files: hold out the last 5% of the text instead
        whole = b"".join(train)
        cut = len(whole) - max(1, len(whole) // HELD_OUT_EVERY)
        train, validation = [whole[:cut]], [whole[cut:]]
    source = "Python standard library" if path is None else str(root)
    return Corpus(
        np.frombuffer(b"".join(train), np.uint8),
        np.frombuffer(b"".join(validation), np.uint8),
        len(files),
        source,
        digest.hexdigest()[:12],
    )


@dataclass(frozen=True)
class Size:
    """A GPT-2-style decoder's shape and the batch it trains with."""

    name: str
    layers: int
    width: int
    heads: int
    context: int  # positions the model has; the training sequence length is at most this
    vocab: int = VOCAB
    seq: int = 64  # training sequence length (default)
    batch: int = 8  # sequences per step (default)

    def parameters(self) -> int:
        """Exact count for the torch and Flax models: embeddings (tied head), blocks, final LayerNorm."""
        d = self.width
        block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
        return self.vocab * d + self.context * d + self.layers * block + 2 * d


SIZES = {
    "tiny": Size("tiny", layers=2, width=64, heads=4, context=64, seq=64, batch=8),
    "small": Size("small", layers=6, width=384, heads=6, context=256, seq=128, batch=8),
    # GPT-2 small's shape and parameter count (124M): its 50257-entry embedding table kept although bytes use
    # only the first 256 rows, so memory and message sizes are those of the real model
    "gpt2": Size("gpt2", layers=12, width=768, heads=12, context=1024, vocab=50257, seq=128, batch=1),
}


LR = {"tiny": 3e-3, "small": 1e-3, "gpt2": 3e-4}
"""AdamW's learning rate per size (no schedule: runs are short)."""
STEPS_PER_EPOCH = {"tiny": 20, "small": 50, "gpt2": 20}
"""Batches per rank in an epoch: the corpus is far larger than a run reads, so an epoch is a number of steps."""
CI_CORPUS_BYTES = 4_000_000
"""The tiny size reads at most this much text by default: its runs read far less than the whole library."""


def estimate_bytes(size: Size, seq: int, batch: int, bytes_per_value: int = 4, copies: float = 6.0) -> int:
    """A rank's resident bytes while training, roughly: ``copies`` times the parameters (model, gradients, Adam's
    two moments, and up to two copies a strategy keeps) plus the activations backward needs (per layer about
    16 values per token and width, and the attention matrices, plus the logits)."""
    tokens = seq * batch
    activations = (
        size.layers * (16 * tokens * size.width + 2 * batch * size.heads * seq * seq) + 3 * tokens * size.vocab
    )
    return int((copies * size.parameters() + activations) * bytes_per_value)


def available_bytes() -> int | None:
    """Memory the machine can still give (MemAvailable), None where /proc/meminfo is not readable."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits(size: Size, seq: int, batch: int, ranks_here: int, available: int | None = None) -> str | None:
    """None when ``ranks_here`` ranks of this size fit in this machine's available memory, else the one line that
    says why not (checked before any rank allocates the model)."""
    available = available_bytes() if available is None else available
    if available is None:
        return None
    need = estimate_bytes(size, seq, batch) * ranks_here
    if need <= available:
        return None
    return (
        f"size {size.name} ({size.parameters() / 1e6:.1f}M parameters, sequence {seq}, batch {batch}) needs about "
        f"{need / 2**30:.1f} GiB for {ranks_here} rank(s) on this machine (6 copies of the parameters plus "
        f"activations, {estimate_bytes(size, seq, batch) / 2**30:.2f} GiB each) but {available / 2**30:.1f} GiB is "
        "available: use a smaller --size, --seq or --batch-size, or fewer ranks per machine"
    )


def windows(tokens: np.ndarray, seq: int, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random windows of ``seq + 1`` tokens: (inputs, next-token targets), int64, shape (count, seq)."""
    starts = rng.integers(0, len(tokens) - seq - 1, size=count)
    rows = np.stack([tokens[s : s + seq + 1] for s in starts]).astype(np.int64)
    return rows[:, :-1], rows[:, 1:]


def shard_tokens(tokens: np.ndarray, rank: int, size: int) -> np.ndarray:
    """This rank's contiguous part of the training stream: disjoint shards, as each worker has its own data."""
    length = len(tokens) // size
    return tokens[rank * length : (rank + 1) * length]


def validation_windows(corpus: Corpus, seq: int, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The fixed held-out windows every evaluation uses, the same on every rank."""
    if len(corpus.validation) <= seq + 1:
        raise CorpusError(f"corpus {corpus.source}: its held-out text is shorter than one sequence of {seq + 1} bytes")
    return windows(corpus.validation, seq, count, np.random.default_rng(seed + 10_007))
