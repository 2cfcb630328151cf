"""A ring all-reduce whose chunks travel through a dense codec: what ``allreduce:compress=fp16`` runs.

An MPI all-reduce sums in the buffer's own type, so a codec cannot simply wrap it. Here the ring is written out
with point-to-point messages (Patarasuk and Yuan's bandwidth-optimal ring, as Horovod and NCCL run it): N - 1 steps
of reduce-scatter, where each rank sends a partial sum of one chunk to its right neighbour and adds the decoded
chunk from its left one, then N - 1 steps of all-gather, where the owner of each summed chunk encodes it once and
the payload is forwarded unchanged around the ring. Every rank, the owner included, ends with the decoded values,
so the replicas stay bit-identical as under a plain all-reduce. Each rank sends 2 (N - 1) / N of the buffer, in
the codec's bytes; partial sums are re-encoded at every reduce-scatter hop, so the rounding error grows with N
(bounded by N - 1 roundings of a partial sum). Sparsifying codecs are refused: a sum of sparse vectors is dense.
"""

from __future__ import annotations

import numpy as np

from fast_core.compression.codecs import Codec
from fast_core.engine import Engine


def ring_allreduce(engine: Engine, buf: np.ndarray, codec: Codec, tag: int) -> None:
    """buf <- the sum of every rank's ``buf``, in place, through ``codec`` (collective: every rank calls it)."""
    size, rank = engine.size, engine.rank
    if size == 1:
        return
    bounds = np.linspace(0, len(buf), size + 1).astype(int)
    chunks = [buf[bounds[i] : bounds[i + 1]] for i in range(size)]
    left, right = (rank - 1) % size, (rank + 1) % size

    def payload_length(index: int) -> int:
        return len(codec.encode(np.zeros(len(chunks[index]), np.float32)))

    for step in range(size - 1):  # reduce-scatter: afterwards rank r holds the sum of chunk (r + 1) % size
        out, into = (rank - step) % size, (rank - step - 1) % size
        landing = np.empty(payload_length(into), np.uint8)
        engine.wait_all(engine.exchange(codec.encode(chunks[out]), [right], [landing], [left], tag))
        chunks[into] += codec.decode(landing, len(chunks[into]))
    owned = (rank + 1) % size
    payload = codec.encode(chunks[owned])
    chunks[owned][:] = codec.decode(payload, len(chunks[owned]))  # the owner keeps what the others will decode
    for step in range(size - 1):  # all-gather: each summed chunk's payload goes round the ring unchanged
        into = (rank - step) % size
        landing = np.empty(payload_length(into), np.uint8)
        engine.wait_all(engine.exchange(payload, [right], [landing], [left], tag))
        chunks[into][:] = codec.decode(landing, len(chunks[into]))
        payload = landing
