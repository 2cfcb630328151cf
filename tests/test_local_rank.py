"""fast_core.local_rank / local_size: a rank's place among the ranks of its host (Horovod's local_rank, the GPU a
rank takes), from one allreduce of host-name digests."""

from __future__ import annotations

import fast_core
from fast_core import LocalCluster
from fast_core.runtime.process import host_placement


def test_ranks_of_one_host_are_numbered_in_rank_order() -> None:
    assert LocalCluster(4).run(host_placement) == [(0, 4), (1, 4), (2, 4), (3, 4)]


def test_two_hosts_each_number_their_own_ranks() -> None:
    hosts = ["a", "b", "a", "b", "b"]
    placements = LocalCluster(5).run(lambda engine: host_placement(engine, hosts[engine.rank]))
    assert placements == [(0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


def test_without_a_launcher_this_process_is_alone_on_its_host() -> None:
    assert (fast_core.local_rank(), fast_core.local_size()) == (0, 1)
