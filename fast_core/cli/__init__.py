"""The `fast` command: ``fast run`` (N workers, no mpiexec flags), ``fast bench`` (strategies side by side),
``fast topology`` (neighbours, spectral gap, a drawing), ``fast simulate`` (hundreds of virtual workers on virtual
time), ``fast model`` (predicted step time per strategy), ``fast dashboard`` (a run folder in a web page). One module
per subcommand; errors a user can fix print one line and exit with status 2, without a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fast_core.cli import bench, dashboard, model, run, simulate, topology
from fast_core.cli.common import CLIError
from fast_core.errors import ConfigError


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="fast",
        description="FAST: decentralized data-parallel training. Run a script on N workers, compare strategies, "
        "inspect topologies.",
    )
    subparsers = top.add_subparsers(title="commands", metavar="{run,bench,topology,simulate,model,dashboard}")
    for command in (run, bench, topology, simulate, model, dashboard):
        command.add_parser(subparsers)
    return top


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser().print_help(sys.stderr)
        raise SystemExit(2)
    try:
        status = handler(args)
    except (CLIError, ConfigError, ImportError) as exc:  # ConfigError covers TopologyError
        print(f"fast: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BrokenPipeError:  # `fast topology ring -n 64 | head`: the reader has gone, nothing left to say
        sys.stdout = None
        raise SystemExit(1) from None
    raise SystemExit(status)
