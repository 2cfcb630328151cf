"""fast_tf.horovod in a Horovod TensorFlow 2 custom loop: the wrapped gradient tape and broadcast_variables inside
``tf.function``, and the collectives there, under mpiexec on 2 ranks (tests/tf_adapter/horovod_tape_script.py); in
the same launch, a rank 0 restored with Adam's state restoring every rank, BestModelCheckpoint on rank 0, and
reducescatter, alltoall, grouped_allreduce, barrier and the build queries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpirun import run_mpi

HERE = Path(__file__).resolve().parent


@pytest.mark.mpi
def test_a_horovod_tf2_loop_trains_by_horovods_rule_inside_tf_function(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    run_mpi(2, HERE / "horovod_tape_script.py", str(out), timeout=240)
    result = json.loads(out.read_text())
    assert result["ranks_equal"] and result["moved"] > 1e-3
    assert result["partial_is_own"] and result["full_is_not_own"]  # PartialDistributedGradientTape's local layer
    assert result["error"] < 1e-5, result  # float32 training against the float64 rule over 6 steps
    assert result["allreduce"] == [1.5] * 3 and result["sum"] == [3.0] * 3  # ranks hold 1 and 2
    assert result["allgather"] == [0, 1] and result["broadcast"] == [2.0] * 3
    ranks = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]
    for rank, seen in enumerate(ranks):
        assert seen["restored_equal"], "Adam's state of rank 0 did not reach rank 1: the ranks' models differ"
        assert seen["best_tracked"] == (rank == 0)  # rank 0 alone tracks and writes the best model
        # rows 0-4 summed over ranks (x1 + x2 = x3): rank 0 keeps 3 rows, rank 1 the last 2
        total = [[3.0 * (2 * r), 3.0 * (2 * r + 1)] for r in range(5)]
        mine = total[:3] if rank == 0 else total[3:]
        assert seen["reducescatter"] == mine and seen["reducescatter_graph"] == mine
        assert seen["alltoall"] == ([0, 10] if rank == 0 else [1, 2, 11, 12])
        assert seen["alltoall_from"] == ([1, 1] if rank == 0 else [2, 2])
        assert seen["grouped"] == [0.5, 1.0] and seen["queries"] == [True, True, False, False, False]
        assert seen["no_input_equal"] and seen["no_input_steps"] == 3  # built in the first step, all 3 steps counted
        assert seen["compress"] == ["none", "fp16", "int8"] and 0.4 < seen["bytes_ratio"] < 0.6  # fp16: half
        assert 0.2 < seen["int8_bytes_ratio"] < 0.45, seen  # int8 by name: a quarter and its scales
    assert (tmp_path / "best.keras").is_file()
