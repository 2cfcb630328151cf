"""The strategy flags of ``fast bench``, ``fast model`` and ``fast simulate``, and the one parse of each string.

``--strategy SPEC`` takes one whole strategy string, commas included, and may be repeated. ``--strategies LIST
[LIST ...]`` takes lists of them, separated by spaces or commas: a list is cut only where a new strategy name
starts (fast_core.grammar.lists), so ``allreduce,dpsgd:ring,every=4 async`` is three strategies. Both flags add
to one list in command-line order; each string is parsed once, here, into the StrategySpec the command carries.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from fast_core.cli.common import CLIError
from fast_core.errors import ConfigError
from fast_core.grammar import split_specs
from fast_core.strategies.spec import StrategySpec

LISTS_HELP = (
    "strategy strings separated by spaces or commas: a list is cut only where a new name starts (a piece with no "
    "= before its first :), so options stay with their strategy, e.g. allreduce,dpsgd:ring,every=4 async; a bare "
    "item (the topology) goes right after its strategy's colon"
)


class _Collect(argparse.Action):
    """Adds what each flag gives to ``args.strategy_texts`` in command-line order: (a whole strategy string, False)
    for ``--strategy``, (a list, True) for each argument of ``--strategies``."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        given = [(values, False)] if isinstance(values, str) else [(listed, True) for listed in values]
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *given])


def add_strategy_options(parser: argparse.ArgumentParser, default: Sequence[str]) -> None:
    """``--strategy SPEC`` (repeatable) and ``--strategies LIST [LIST ...]``; ``default``: what runs without them."""
    parser.add_argument(
        "--strategy",
        dest="strategy_texts",
        action=_Collect,
        metavar="SPEC",
        help="one whole strategy string, options and commas included (e.g. dpsgd:ring,every=4); repeat it for "
        f"several (default: {' '.join(default)})",
    )
    parser.add_argument(
        "--strategies", dest="strategy_texts", action=_Collect, nargs="+", metavar="LIST", help=LISTS_HELP
    )


def chosen_strategies(args: argparse.Namespace, default: Sequence[str]) -> list[tuple[str, StrategySpec]]:
    """(the string as given, its StrategySpec) for each strategy of the command line, else of ``default``; each
    parsed once. A name or option the registry does not know is one ConfigError line."""
    given = args.strategy_texts if args.strategy_texts is not None else [(text, False) for text in default]
    chosen = []
    for text, listed in given:
        texts = split_specs(text) if listed else [text]
        chosen += [(each, _parse(each, after_another=index > 0)) for index, each in enumerate(texts)]
    if not chosen:
        raise CLIError(f"--strategies is empty; give e.g. {','.join(default)}")
    return chosen


def _parse(text: str, after_another: bool) -> StrategySpec:
    try:
        return StrategySpec.parse(text)
    except ConfigError as exc:
        if after_another and ":" not in text and str(exc).startswith("unknown strategy"):
            raise ConfigError(
                f"{exc}; if '{text}' is the bare item of the strategy before it, write it right after that "
                "strategy's colon (dpsgd:ring,every=4)"
            ) from None
        raise
