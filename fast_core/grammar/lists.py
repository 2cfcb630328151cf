"""A list of spec strings in one argument: ``allreduce,dpsgd:ring,every=4,async`` is three strategies.

A list is cut only at commas outside parentheses, and a new spec starts at each piece that begins with a name: a
piece with no ``=`` before its first ``:`` (``async``, ``dpsgd:ring``). A piece ``key=value`` belongs to the spec
before it, so ``every=4`` above is D-PSGD's and ``compress=topk:ratio=0.01`` stays whole. The one thing a list
cannot hold is a bare item after a keyed one (``dpsgd:every=4,ring``): there ``ring`` would start a spec, so write
the bare item first (``dpsgd:ring,every=4``) or give each spec as an argument of its own.
"""

from __future__ import annotations

from fast_core.errors import ConfigError
from fast_core.grammar.spec import split_top_level


def split_specs(text: str) -> list[str]:
    """The specs of a comma list, each as written (``"a,b:x,k=1"`` -> ``["a", "b:x,k=1"]``)."""
    specs: list[list[str]] = []
    for piece in split_top_level(text):
        if _starts_a_spec(piece):
            specs.append([piece])
        elif specs:
            specs[-1].append(piece)
        else:
            raise ConfigError(
                f"'{text}' starts with the option '{piece}' before any name; put it after its strategy, e.g. "
                f"dpsgd:ring,{piece}"
            )
    return [",".join(pieces) for pieces in specs]


def _starts_a_spec(piece: str) -> bool:
    head = piece.split(":", 1)[0]
    return "=" not in head and not piece.startswith("(")
