"""Topologies that average exactly in finite time: Base-(k+1) graphs and the k-peer exponential graph.

Base-(k+1) graphs (Takezawa et al., NeurIPS 2023): exact average in finite time over any number of ranks.

A sequence of undirected graphs in which every rank talks to at most k peers per step, and whose mixing matrices
multiply, over one period, to exactly 11^T/N for every N (the exponential graphs manage that only for N a power of
two). Three pieces, each a list of rounds, a round being disjoint blocks (ranks, symmetric doubly stochastic W):

- the k-peer hyper-hypercube over n ranks whose prime factors are all <= k+1: n = f_1 ... f_L greedily with the
  largest factors f_l <= k+1 first; round l averages each group of f_l ranks that differ only in digit l of the
  mixed-radix numbering (weights 1/f_l): L rounds.
- the simple Base-(k+1) graph over any n: n written in base k+1 as the parts a_l (k+1)^(p_l), p_1 > p_2 > ...;
  every part averages inside (hyper-hypercube; a part with fewer rounds repeats its own, as the authors' code
  does), then part by part, every rank of the later parts pairs with one
  rank of each of the a_l subgroups of part l (weights |V_l| / |V_l ∪ later parts| in all), so each subgroup of
  part l then holds the global mean in sum; a final hyper-hypercube inside each subgroup spreads it.
- the Base-(k+1) graph: n = s q with s the largest divisor of n whose prime factors are <= k+1; the simple graph
  inside s blocks of q ranks, then the hyper-hypercube over the s ranks with the same place in their blocks; or the
  simple graph over all n when that is strictly shorter.

This follows the paper and the authors' code (github.com/yukiTakezawa/BaseGraph), written anew: the same rounds,
weights and choice between the two constructions, and the same optional edges among the ranks left idle in a
pairing round (they already agree there, so they change nothing in exact arithmetic, but mix what training adds).
"""

from __future__ import annotations

import numpy as np

from fast_core.topology.base import Phase, Topology
from fast_core.topology.builtin import peer_phases
from fast_core.topology.checks import TopologyError, checked_peers, checked_size

Block = tuple[list[int], np.ndarray]
Round = list[Block]


def _uniform(nodes: list[int]) -> Block:
    return list(nodes), np.full((len(nodes), len(nodes)), 1.0 / len(nodes))


def _factors(n: int, k: int) -> list[int] | None:
    """n as a product of factors <= k+1, largest taken first (smallest first in the list); None if there is none."""
    factors, rest = [], n
    for factor in range(k + 1, 1, -1):
        while rest % factor == 0:
            factors.append(factor)
            rest //= factor
    return factors[::-1] if rest == 1 else None


def hyper_hypercube(nodes: list[int], k: int) -> list[Round]:
    """Rounds that average `nodes` exactly, each rank in a group of at most k+1 per round."""
    factors = _factors(len(nodes), k)
    if factors is None:
        raise TopologyError(f"{len(nodes)} ranks have a prime factor above k+1 = {k + 1}; use base_graph")
    rounds, stride = [], 1
    for factor in factors:
        starts = [i for i in range(len(nodes)) if (i // stride) % factor == 0]
        rounds.append([_uniform([nodes[i + m * stride] for m in range(factor)]) for i in starts])
        stride *= factor
    return rounds


def _parts(n: int, k: int) -> list[tuple[int, int]]:
    """The nonzero base-(k+1) digits of n as (a, p), n = sum a (k+1)^p, highest power first."""
    parts, p = [], 0
    while n:
        n, a = divmod(n, k + 1)
        if a:
            parts.append((a, p))
        p += 1
    return parts[::-1]


def _star(center: int, leaves: list[int], weight: float) -> Block:
    """center gives `weight` in all, split evenly over the leaves; each leaf takes weight/len(leaves) of it."""
    share = weight / len(leaves)
    W = np.zeros((len(leaves) + 1, len(leaves) + 1))
    W[0, 0] = 1.0 - weight
    W[0, 1:] = W[1:, 0] = share
    W[np.arange(1, len(leaves) + 1), np.arange(1, len(leaves) + 1)] = 1.0 - share
    return [center, *leaves], W


def _cycled(rounds: list[Round], m: int) -> Round:
    return rounds[m % len(rounds)] if rounds else []


def simple_base_rounds(nodes: list[int], k: int) -> list[Round]:
    """The simple Base-(k+1) graph over `nodes` (no rounds for one rank)."""
    n = len(nodes)
    if n == 1:
        return []
    if _factors(n, k) is not None:
        return hyper_hypercube(nodes, k)
    parts, start = [], 0
    for a, p in _parts(n, k):
        size = a * (k + 1) ** p
        group = nodes[start : start + size]
        parts.append([group[c * (k + 1) ** p : (c + 1) * (k + 1) ** p] for c in range(a)])
        start += size
    flat = [[r for sub in part for r in sub] for part in parts]
    inside = [hyper_hypercube(part, k) for part in flat]
    # the last stage of a part: a hyper-hypercube in each subgroup, or over the part when its subgroups are one rank
    final = [
        [hyper_hypercube(sub, k) for sub in part] if len(part[0]) > 1 else [hyper_hypercube(ranks, k)]
        for part, ranks in zip(parts, flat, strict=True)
    ]
    rounds: list[Round] = [[b for rs in inside for b in _cycled(rs, m)] for m in range(len(inside[0]))]
    sizes, last = [len(ranks) for ranks in flat], len(parts) - 1
    done = [0] * len(parts)
    for stage in range(len(final[0][0]) + 1):  # stage s pairs part s with the later parts while s < last
        blocks: Round = []
        if stage < last:
            subgroups = [list(sub) for sub in parts[stage]]
            weight = sizes[stage] / sum(sizes[stage:])
            for later in reversed(flat[stage + 1 :]):
                blocks.extend(_star(i, [sub.pop() for sub in subgroups], weight) for i in later)
            idle = [r for sub in subgroups for r in sub]
            blocks.extend(_uniform(idle[c : c + k + 1]) for c in range(0, len(idle) - 1, k + 1))
        for index in range(min(stage + 1, len(parts))):
            if index < stage or index == last:
                blocks.extend(b for rs in final[index] for b in _cycled(rs, done[index]))
                done[index] += 1
        rounds.append(blocks)
    return rounds


def base_rounds(n: int, k: int) -> list[Round]:
    """The Base-(k+1) graph over ranks 0..n-1: the shorter of the two constructions (the product one on a tie)."""
    nodes = list(range(n))
    simple = simple_base_rounds(nodes, k)
    smooth, rest = 1, n
    for prime in range(2, k + 2):
        while rest % prime == 0:
            smooth, rest = smooth * prime, rest // prime
    if smooth == 1 or rest == 1:
        return simple
    blocks = [simple_base_rounds(nodes[b * rest : (b + 1) * rest], k) for b in range(smooth)]
    columns = [hyper_hypercube(nodes[j::rest], k) for j in range(rest)]
    product = [[b for rs in blocks for b in rs[m]] for m in range(len(blocks[0]))]
    product += [[b for rs in columns for b in rs[m]] for m in range(len(columns[0]))]
    return product if len(product) <= len(simple) else simple


def _phase(size: int, blocks: Round) -> Phase:
    rows: list[dict[int, float]] = [{} for _ in range(size)]
    own = [1.0] * size
    for ranks, W in blocks:
        for a, i in enumerate(ranks):
            own[i] = float(W[a, a])
            rows[i].update({j: float(W[a, b]) for b, j in enumerate(ranks) if b != a and W[a, b] > 0})
    return Phase(rows, own)


def base_graph(size: int, k: int = 1, weights: str = "uniform") -> Topology:
    """The Base-(k+1) graph: at most k peers per rank and step, exact average after one period for any size.

    The weights are the construction's own (``weights`` only accepts the default, which every strategy passes).
    The period (steps to the exact average): the number of factors of the hyper-hypercube when every prime factor
    of size is <= k+1; else for the simple graph 2 p + 1 + [a > 1], with a (k+1)^p the leading base-(k+1) digit of
    size, and for the product form simple(q) + factors(s) (module docstring), whichever is shorter. It is at most
    2 log_{k+1}(size) + 2 (the paper's bound); one rank has a period of one step that does nothing.
    """
    size = checked_size(size)
    k = checked_peers(k)
    if weights != "uniform":
        raise TopologyError(
            f"the Base-(k+1) graph has the weights of its construction, not {weights!r}; drop the weights option"
        )
    rounds = base_rounds(size, k) or [[]]
    return Topology("base", [_phase(size, blocks) for blocks in rounds], weights=weights, k=k)


def k_peer_exponential(size: int, k: int = 1, weights: str = "uniform") -> Topology:
    """k-peer exponential graph: at step t rank i sends to (i + m (k+1)^(t % tau)) mod size, m = 1..k.

    A faithful generalisation of the one-peer exponential graph of Ying et al. 2021 (k = 1 is exactly ``exp1``),
    not a graph from that paper: with uniform weights 1/(k+1) each round multiplies by
    (I + P^h + ... + P^(k h)) / (k+1) for the cyclic shift P and h = (k+1)^t, so tau = ceil(log_{k+1} size)
    rounds give (1/N) sum_s P^s = 11^T/N, the exact average, when size is a power of k+1. For k + 1 = 2^r one
    round is r consecutive one-peer rounds merged (hops: the sums of r consecutive powers of two). Hops 2^j for k
    consecutive j with weights 1/(k+1) do not average exactly in general (N = 4, k = 2: W = (I + P + P^2)/3 every
    round, whose eigenvalues at P = -1, i, -i are never 0), hence base k+1.
    """
    size = checked_size(size)
    k = checked_peers(k)
    return Topology("k_peer_exponential", peer_phases(size, k, weights), weights=weights, k=k)
