"""fast_torch.horovod's collectives on real ranks, checked against NumPy on every rank (one mpiexec launch).

    OMP_NUM_THREADS=1 mpiexec -n 3 python -m mpi4py tests/torch_adapter/horovod_cases.py

An assertion that fails ends the job with a nonzero status; the last line is "horovod cases passed" on each rank.
"""

from __future__ import annotations

import numpy as np
import torch

import fast_torch.horovod as hvd


def check_allreduce(rank: int, size: int) -> None:
    mine = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (rank + 1)
    ranks = np.arange(1, size + 1, dtype=np.float64)
    base = np.arange(6, dtype=np.float64).reshape(2, 3)
    np.testing.assert_allclose(hvd.allreduce(mine).numpy(), base * ranks.mean(), rtol=1e-6)
    np.testing.assert_allclose(hvd.allreduce(mine, op=hvd.Sum).numpy(), base * ranks.sum(), rtol=1e-6)
    np.testing.assert_allclose(hvd.allreduce(mine, average=False).numpy(), base * ranks.sum(), rtol=1e-6)
    np.testing.assert_array_equal(hvd.allreduce(mine, op=hvd.Max).numpy(), base * size)
    np.testing.assert_array_equal(hvd.allreduce(mine, op=hvd.Min).numpy(), base)
    scaled = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    np.testing.assert_allclose(scaled.numpy(), base * ranks.sum() * 1.5, rtol=1e-6)
    half = hvd.allreduce(mine.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and half.shape == (2, 3)
    counts = hvd.allreduce(torch.tensor([rank, 1], dtype=torch.int64), op=hvd.Sum)
    assert counts.dtype == torch.int64 and counts.tolist() == [sum(range(size)), size]
    inplace = mine.clone()
    assert hvd.allreduce_(inplace) is inplace
    np.testing.assert_allclose(inplace.numpy(), base * ranks.mean(), rtol=1e-6)
    handle = hvd.allreduce_async(mine)
    assert hvd.poll(handle)
    np.testing.assert_allclose(hvd.synchronize(handle).numpy(), base * ranks.mean(), rtol=1e-6)
    grouped = hvd.grouped_allreduce([mine, mine[0]])
    np.testing.assert_allclose(grouped[1].numpy(), base[0] * ranks.mean(), rtol=1e-6)


def check_gather_and_broadcast(rank: int, size: int) -> None:
    rows = torch.full((rank + 1, 2), 2.0**40 + rank, dtype=torch.float64)  # ranks send different row counts
    gathered = hvd.allgather(rows)
    expected = np.concatenate([np.full((r + 1, 2), 2.0**40 + r) for r in range(size)])
    np.testing.assert_array_equal(gathered.numpy(), expected)
    big = hvd.allgather(torch.tensor([2**62 + rank], dtype=torch.int64))  # bit-exact beyond float64's integers
    assert big.tolist() == [2**62 + r for r in range(size)]
    root = size - 1
    value = torch.tensor([0.1 * rank, 7.0], dtype=torch.float16)
    assert torch.equal(hvd.broadcast(value, root_rank=root), torch.tensor([0.1 * root, 7.0], dtype=torch.float16))
    hvd.broadcast_(value, root_rank=0)
    assert torch.equal(value, torch.tensor([0.0, 7.0], dtype=torch.float16))
    config = {"lr": 0.1 * rank, "layers": [rank, "dense"], "name": f"rank {rank}", "ok": True, "none": None}
    assert hvd.broadcast_object(config, root_rank=1) == {
        "lr": 0.1,
        "layers": [1, "dense"],
        "name": "rank 1",
        "ok": True,
        "none": None,
    }
    assert hvd.allgather_object({"rank": rank}) == [{"rank": r} for r in range(size)]


def check_scatter_alltoall_and_the_rest(rank: int, size: int) -> None:
    rows = torch.arange(14, dtype=torch.float32).reshape(7, 2) * (rank + 1)
    total = np.arange(14, dtype=np.float64).reshape(7, 2) * sum(range(1, size + 1))
    counts = hvd_counts(7, size)  # 7 rows over 3 ranks: 3, 2, 2
    start = sum(counts[:rank])
    np.testing.assert_allclose(hvd.reducescatter(rows, op=hvd.Sum).numpy(), total[start : start + counts[rank]])
    np.testing.assert_allclose(hvd.reducescatter(rows).numpy(), total[start : start + counts[rank]] / size, rtol=1e-6)
    splits = [r + 1 for r in range(size)]  # every rank sends d + 1 rows to rank d
    sent = torch.tensor([[100 * rank + i] for i in range(sum(splits))], dtype=torch.int64)
    received, came = hvd.alltoall(sent, splits=splits)
    offset = sum(splits[:rank])
    expected = [100 * r + offset + i for r in range(size) for i in range(splits[rank])]
    assert received.ravel().tolist() == expected and came.tolist() == [rank + 1] * size
    grouped = hvd.synchronize(hvd.grouped_allreduce_async([torch.tensor([float(rank)]), torch.tensor([1.0])]))
    assert [g.item() for g in grouped] == [np.mean(range(size)), 1.0]
    hvd.barrier()
    assert (hvd.mpi_built(), hvd.mpi_enabled(), hvd.nccl_built(), hvd.gloo_built()) == (True, True, False, False)
    assert hvd.mpi_threads_supported()  # mpich's wheel grants MPI_THREAD_MULTIPLE
    scattered = hvd.synchronize(hvd.reducescatter_async(rows, op=hvd.Sum))
    np.testing.assert_allclose(scattered.numpy(), total[start : start + counts[rank]])
    received, came = hvd.synchronize(hvd.alltoall_async(sent, splits=splits))
    assert received.ravel().tolist() == expected and came.tolist() == [rank + 1] * size


def hvd_counts(rows: int, size: int) -> list[int]:
    """Horovod's split of a first dimension over ranks: as even as possible, the first ranks one more."""
    return [rows // size + (r < rows % size) for r in range(size)]


def check_optimizer_state(rank: int, size: int) -> None:
    """Rank 0 has taken Adam steps (a loaded checkpoint); the others hold a new optimizer with no state."""
    torch.manual_seed(rank)
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1), betas=(0.8, 0.99))
    if rank == 0:
        for _ in range(3):
            model(torch.ones(4, 3)).square().sum().backward()
            optimizer.step()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    state = optimizer.state_dict()
    assert state["param_groups"][0]["lr"] == 0.01 and state["param_groups"][0]["betas"] == (0.8, 0.99)
    assert sorted(state["state"]) == [0, 1] and float(state["state"][0]["step"]) == 3.0
    summary = torch.cat([state["state"][i][key].reshape(-1) for i in (0, 1) for key in ("exp_avg", "exp_avg_sq")])
    everyone = hvd.allgather(summary[None])
    assert torch.equal(everyone, summary[None].expand(size, -1)), "the ranks' optimizer states differ"
    assert float(summary.abs().sum()) > 0  # rank 0's moments, not zeros


def check_state_dict_broadcast(rank: int, size: int) -> None:
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    model[1].num_batches_tracked.fill_(10 + rank)  # an integer buffer
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    flat = torch.cat([t.double().reshape(-1) for t in model.state_dict().values()])
    assert torch.equal(hvd.allgather(flat[None]), flat[None].expand(size, -1))
    assert int(model[1].num_batches_tracked) == 10


if __name__ == "__main__":
    hvd.init()
    torch.set_num_threads(1)
    me, n = hvd.rank(), hvd.size()
    assert (hvd.local_rank(), hvd.local_size()) == (me, n)  # one host
    cases = (check_allreduce, check_gather_and_broadcast, check_scatter_alltoall_and_the_rest, check_optimizer_state)
    for case in (*cases, check_state_dict_broadcast):
        case(me, n)
    print("horovod cases passed", flush=True)
