"""fast_tf.horovod in a Horovod TensorFlow 2 custom loop: the wrapped gradient tape and broadcast_variables inside
``tf.function``, and the collectives there, under mpiexec on 2 ranks (tests/tf_adapter/horovod_tape_script.py)."""

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
