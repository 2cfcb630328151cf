"""TensorBoard scalars of a running job, made from the very records the run folder gets, so the two never disagree.

The Reporter hands each record it writes to ``rank<r>.jsonl`` to this sink too (``fast run --tensorboard DIR``, or
``tensorboard=DIR`` of the Worker and the adapters). Each value becomes one scalar, its step the record's step and
its wall time the rank's ``wall_start`` plus the record's ``time``:

- ``DIR/rank<r>``, one TensorBoard run per rank: ``<kind>/<field>`` of its "step", "epoch", "close" and "result"
  records: the script's values and, of "step" records alone, the worker's counters (``step/loss``,
  ``step/steps_per_second``, ``step/compute_seconds``, ``step/wait_seconds``, ``step/mean_staleness``,
  ``step/bytes_sent``, ``step/refused_messages``, ``epoch/val_accuracy``, ``result/test_accuracy``, ...). One tag
  in several runs: TensorBoard draws the ranks in one chart.
- ``DIR/job``, written by rank 0 alone, since these values are the job's and rank 0 holds them: ``job/size`` at
  the start, ``job/consensus_distance`` each time a new one was computed (a collective: every rank holds the same),
  ``job/samples_left`` of a sample budget (rank 0 holds the job's counter), ``membership/<field>`` when the group
  changed, and ``consensus/<metric>`` of the consensus model over time (rank 0 evaluates it). The consensus model
  has no step of its own (its ranks were at different steps): its step axis counts milliseconds since the common
  start.

Values are stored as doubles (a tensor scalar, as TensorBoard's own summaries write them), so a scalar read back is
the record's number exactly. The writer is tensorboardX's, imported only when asked for (the ``tensorboard`` extra);
nothing here imports a framework.
"""

from __future__ import annotations

import importlib.util
import itertools
import numbers
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fast_core.errors import ConfigError
from fast_core.observers.runlog import COUNTERS, plain

EXTRA = "pip install 'fast-training[tensorboard]'"
"""How to install the writer; the one line a missing tensorboardX is told with."""
RANK_KINDS = ("step", "epoch", "close", "result")
"""Record kinds whose values are a rank's own scalars."""
JOB_VALUES = ("consensus_distance", "samples_left")
"""Fields every record carries that are the job's, not the rank's: rank 0 writes them once, to the job's run."""
COUNTED = frozenset({*COUNTERS, "compute_seconds", *JOB_VALUES})
"""What the Reporter adds to every record: scalars of the "step" records only (the other kinds hold the same counts
at other steps), so an "epoch" or "result" scalar is what the script recorded."""
NOT_SCALARS = frozenset({"kind", "rank", "step", "time", "wall_start", "wall_stop", "pid", "log_every"})
"""Numbers of a record that are bookkeeping, not something to watch."""
JOB_RUN = "job"
_FILES = itertools.count()  # event files this process opened: each name is new (tensorboardX opens with "wb")


def rank_run(rank: int) -> str:
    """The TensorBoard run (a subfolder of DIR) of one rank's scalars."""
    return f"rank{rank}"


def check_folder(folder: Path) -> Path:
    """``folder`` created and writable, and the writer installed, else one ConfigError line saying what to fix
    (``fast run`` asks before any rank starts; nothing is imported)."""
    if importlib.util.find_spec("tensorboardX") is None:
        raise ConfigError(f"TensorBoard scalars need tensorboardX: {EXTRA}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ConfigError(
            f"TensorBoard folder {folder}: cannot write there ({exc.strerror or exc}); give a folder you may create "
            "and write"
        ) from None
    return folder


class TensorBoard:
    """One rank's TensorBoard runs: its own, and the job's on rank 0. Made before training (a folder it cannot
    write is a ConfigError then); ``write`` takes each record the Reporter writes."""

    def __init__(self, folder: Path | str, rank: int) -> None:
        self.folder = check_folder(Path(folder))
        self.rank = rank
        self._runs = {rank_run(rank): _Run(self.folder / rank_run(rank))}
        if rank == 0:
            self._runs[JOB_RUN] = _Run(self.folder / JOB_RUN)
        self._wall_start = 0.0
        self._distance: float | None = None  # the last consensus distance written: a new one is a new measurement

    def write(self, record: Mapping[str, Any]) -> None:
        """The record's scalars, written and flushed at once (a TensorBoard reading the folder sees them now)."""
        record = plain(record)
        if record["kind"] == "start":
            self._wall_start = record["wall_start"]
            self._distance = None
        for run, tag, step, seconds, value in self.scalars(record):
            self._runs[run].add(tag, value, step, self._wall_start + seconds)
        for run in self._runs.values():
            run.flush()

    def scalars(self, record: Mapping[str, Any]) -> Iterator[tuple[str, str, int, float, float]]:
        """(run, tag, step, seconds since the start, value) of each scalar of ``record`` (plain JSON values)."""
        kind, step, seconds = record["kind"], record["step"], record["time"]
        if kind in RANK_KINDS:
            for key, value in _numbers(record):
                if key not in JOB_VALUES and (kind == "step" or key not in COUNTED):
                    yield rank_run(self.rank), f"{kind}/{key}", step, seconds, value
        if JOB_RUN not in self._runs:
            return
        if kind == "start":
            yield JOB_RUN, "job/size", step, seconds, float(record["size"])
        elif kind == "consensus":  # a point of the consensus curve: its "time" is the point's, after the common start
            for key, value in _numbers(record):
                if key not in COUNTED:
                    yield JOB_RUN, f"consensus/{key}", round(seconds * 1000), seconds, value
        elif kind == "membership":
            yield JOB_RUN, "membership/size", step, seconds, float(record["size"])
            yield JOB_RUN, "membership/lost", step, seconds, float(_count(record.get("lost")))
            yield JOB_RUN, "membership/replaced", step, seconds, float(_count(record.get("replaced")))
            yield JOB_RUN, "membership/recovery_seconds", step, seconds, float(record["recovery_seconds"])
        distance = record.get("consensus_distance")
        if distance is not None and distance != self._distance:
            self._distance = distance
            yield JOB_RUN, "job/consensus_distance", step, seconds, float(distance)
        left = record.get("samples_left")
        if left is not None and kind in ("step", "close"):
            yield JOB_RUN, "job/samples_left", step, seconds, float(left)

    def close(self) -> None:
        for run in self._runs.values():
            run.close()


def _numbers(record: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """The record's fields that are numbers worth a scalar (not bookkeeping, not True/False, not None)."""
    for key, value in record.items():
        if key not in NOT_SCALARS and isinstance(value, numbers.Real) and not isinstance(value, bool):
            yield key, float(value)


def _count(numbers_text: object) -> int:
    """How many launch numbers a membership record's comma-separated field names."""
    return len([n for n in str(numbers_text or "").split(",") if n.strip()])


class _Run:
    """One TensorBoard run: an event file in its own folder, written synchronously (no thread, no queue)."""

    def __init__(self, folder: Path) -> None:
        writer, self._event, self._summary, self._tensor, self._double = _library()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._writer = writer(os.path.join(folder, "events"), f".{os.getpid()}.{next(_FILES)}")
        except OSError as exc:
            raise ConfigError(f"TensorBoard folder {folder}: cannot write there ({exc.strerror or exc})") from None
        self._metadata = self._summary.SummaryMetadata(
            plugin_data=self._summary.SummaryMetadata.PluginData(plugin_name="scalars")
        )

    def add(self, tag: str, value: float, step: int, wall_time: float) -> None:
        tensor = self._tensor.TensorProto(dtype=self._double, double_val=[value])
        entry = self._summary.Summary.Value(tag=tag, tensor=tensor, metadata=self._metadata)
        summary = self._summary.Summary(value=[entry])
        self._writer.write_event(self._event.Event(wall_time=wall_time, step=step, summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _library() -> tuple[Any, Any, Any, Any, int]:
    """tensorboardX's synchronous event writer and the protocol buffers of an event, imported when first asked.

    tensorboardX's package imports torch whenever torch is installed, for a type hint of the writer we do not use:
    a rank that has not imported torch itself (NumPy, Keras, JAX) would load it for nothing, seconds and hundreds of
    MB each. So torch is hidden while tensorboardX loads, and only then."""
    hidden = "torch" not in sys.modules
    if hidden:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError meanwhile
    try:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    except ImportError:
        raise ConfigError(f"TensorBoard scalars need tensorboardX: {EXTRA}") from None
    finally:
        if hidden and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return EventsWriter, event_pb2, summary_pb2, tensor_pb2, types_pb2.DT_DOUBLE
