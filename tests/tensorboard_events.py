"""Read TensorBoard event files back as TensorBoard would, for the tests that hold them to the run's records.

tensorboardX writes event files but reads none, and TensorBoard's own reader comes with all of TensorBoard: this
reads the TFRecord framing (length, its masked CRC-32C, the event, its masked CRC-32C: a torn or corrupt record
fails) and decodes each event with tensorboardX's protocol buffers; ``check_against_records`` holds a run's
TensorBoard folder to its run folder.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from fast_core.observers.runlog import read_run

Scalars = dict[str, list[tuple[int, float, float]]]
"""Tag: its (step, wall time, value) points in the order written."""


def read_events(path: Path) -> list[event_pb2.Event]:
    """Every event of one event file, each record's checksums checked."""
    data, events, at = path.read_bytes(), [], 0
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[at + 8 : at + 12])[0] == masked_crc32c(header), f"{path}: bad length CRC"
        body = data[at + 12 : at + 12 + length]
        assert struct.unpack("<I", data[at + 12 + length : at + 16 + length])[0] == masked_crc32c(body), path
        events.append(event_pb2.Event.FromString(body))
        at += 16 + length
    return events


def read_scalars(folder: Path) -> Scalars:
    """The scalars of one TensorBoard run (every event file in ``folder``, oldest first), by tag."""
    scalars: Scalars = defaultdict(list)
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in read_events(path):
            for value in event.summary.value:
                number = value.tensor.double_val[0] if value.HasField("tensor") else value.simple_value
                scalars[value.tag].append((event.step, event.wall_time, number))
    return dict(scalars)


RANK_FIELDS = (
    "loss",
    "samples",
    "steps_per_second",
    "compute_seconds",
    "wait_seconds",
    "mean_staleness",
    "staleness_max",
    "bytes_sent",
    "refused_messages",
)
"""What every rank's "step" records carry and its TensorBoard run must show as ``step/<field>``."""


def _points(records: list[dict], wall_start: float, field: str, step: str = "step") -> list[tuple]:
    """The (step, wall time, value) TensorBoard must hold for ``field`` of ``records``."""
    return [(r[step], wall_start + r["time"], r[field]) for r in records]


def check_against_records(tensorboard: Path, run_dir: Path) -> dict[str, dict]:
    """Every rank's scalars and the job's, each equal to its record's value (step, wall time, value); returns the
    scalars by run."""
    ranks = read_run(run_dir)
    runs = {path.name: read_scalars(path) for path in tensorboard.iterdir()}
    assert sorted(runs) == sorted(["job", *(f"rank{r}" for r in ranks)])
    for rank, records in ranks.items():
        scalars, wall_start = runs[f"rank{rank}"], records[0]["wall_start"]
        steps = [r for r in records if r["kind"] == "step"]
        assert steps, rank
        for field in RANK_FIELDS:
            assert scalars[f"step/{field}"] == _points(steps, wall_start, field), (rank, field)
        for kind in ("epoch", "result", "close"):
            of_kind = [r for r in records if r["kind"] == kind]
            for field in ("val_accuracy", "test_accuracy", "samples", "step_time"):
                if of_kind and field in of_kind[0]:
                    assert scalars[f"{kind}/{field}"] == _points(of_kind, wall_start, field), (rank, kind, field)
        assert not [tag for tag in scalars if tag.startswith(("job/", "consensus/", "membership/"))]
        assert not [tag for tag in scalars if not tag.startswith("step/") and tag.endswith("/bytes_sent")]
    job, records = runs["job"], ranks[0]
    wall_start = records[0]["wall_start"]
    assert job["job/size"] == [(0, wall_start + records[0]["time"], float(len(ranks)))]
    measured, last = [], None
    for record in records:
        if record["consensus_distance"] is not None and record["consensus_distance"] != last:
            measured.append(record)
            last = record["consensus_distance"]
    assert job.get("job/consensus_distance", []) == _points(measured, wall_start, "consensus_distance")
    budgeted = [r for r in records if r["kind"] in ("step", "close") and "samples_left" in r]
    assert job.get("job/samples_left", []) == _points(budgeted, wall_start, "samples_left")
    consensus = [{**r, "ms": round(r["time"] * 1000)} for r in records if r["kind"] == "consensus"]
    assert job.get("consensus/val_accuracy", []) == _points(consensus, wall_start, "val_accuracy", "ms")
    curves = sorted(tag for tag in job if tag.startswith("consensus/"))
    assert curves == (["consensus/val_accuracy"] if consensus else [])
    return runs
