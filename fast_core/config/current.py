"""This process's run configuration: read from its environment once, the first time anything asks, then kept.

``fast run`` writes the configuration into each rank's environment before the rank starts
(``RunConfig.to_environment``); the rank reads it back here, once, and hands it down as a value:
``fast_core.init()`` makes the engine from its numbers (timeout, fault tolerance, restarts), and the Worker takes its
strategy, observers and budget from it. Code that was not handed a configuration asks ``run_config()``. This is the
one place a rank reads its FAST_* variables; the ``fast`` command reads its own once (``fast_core.cli.common``).

It lives beside RunConfig, at the bottom of the layers, rather than with ``init`` in ``fast_core.runtime``: the
strategy resolution (``fast_core.strategies.spec``) sits below the runtime and needs the same value.
"""

from __future__ import annotations

import threading

from fast_core.config.run import RunConfig

_lock = threading.Lock()
_config: RunConfig | None = None


def run_config() -> RunConfig:
    """This process's configuration (its FAST_* variables, checked), read at the first call and the same after; a
    bad value raises ConfigError naming the variable, at every call until it is fixed."""
    global _config
    with _lock:
        if _config is None:
            _config = RunConfig.from_environment()
        return _config


def forget_run_config() -> None:
    """Read the environment again at the next ``run_config()``: for tests, each of which plays a new process."""
    global _config
    with _lock:
        _config = None
