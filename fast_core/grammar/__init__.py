"""The text of spec strings, one grammar for strategies (``dpsgd:ring,every=4``) and codecs (``topk:ratio=0.01``).

``spec`` reads and writes one spec, ``lists`` splits a list of them (``fast model --strategies``). Neither knows
which names exist: the strategy registry and the codec registry check what the grammar reads.
"""

from fast_core.grammar.lists import split_specs
from fast_core.grammar.spec import Item, Spec, Value, format_spec, parse_spec, spelled, typed

__all__ = ["Item", "Spec", "Value", "format_spec", "parse_spec", "spelled", "split_specs", "typed"]
