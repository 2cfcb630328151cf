"""The run configuration: every ``FAST_*`` variable is read and checked here, once, and nowhere else.

``fast run`` writes a RunConfig into the ranks' environment (``to_environment``); each rank reads it back once
(``fast_core.config.current.run_config``) and the Worker gets what it describes already resolved: a Strategy
(``strategies.spec.resolve_strategy``), a timeout (given to the engine by ``fast_core.init``), its observers (a
reporter, a simulated straggler) and a shared work budget (``budget``). A bad value is one ``ConfigError`` line
naming the variable and a valid spelling, raised on every rank alike (they all read the same environment). This
module imports nothing of FAST but its errors, so every layer may read it.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fast_core.errors import ConfigError

STRATEGY_VARIABLE = "FAST_STRATEGY"
TOPOLOGY_VARIABLE = "FAST_TOPOLOGY"
TIMEOUT_VARIABLE = "FAST_TIMEOUT"
STRAGGLER_VARIABLE = "FAST_STRAGGLER"
STRAGGLER_RANK_VARIABLE = "FAST_STRAGGLER_RANK"
STRAGGLER_SECONDS_VARIABLE = "FAST_STRAGGLER_SECONDS"
"""The fixed straggler: its rank sleeps exactly this many seconds before each optimizer step, whatever the strategy
(``FAST_STRAGGLER``, the relative form, scales its own measured time instead; give one of the two)."""
RUN_DIR_VARIABLE = "FAST_RUN_DIR"
"""The run folder; each rank appends its records to ``rank<r>.jsonl`` there."""
TENSORBOARD_VARIABLE = "FAST_TENSORBOARD"
"""A folder for TensorBoard: each rank writes its records as scalars there too (``fast_core.observers.tensorboard``)."""
LOG_EVERY_VARIABLE = "FAST_LOG_EVERY"
PROFILE_VARIABLE = "FAST_PROFILE"
"""Set (1) by ``fast run --profile``: each rank splits its time by phase (fast_core.runtime.time_split)."""
"""A "step" record every this many steps (default 10)."""
PROGRESS_VARIABLE = "FAST_PROGRESS"
"""1: rank 0 shows a bar of its own steps (``fast bench`` sets it when its output is a terminal; ``fast run`` shows
the job's bar itself, fast_core/cli/job_bar.py)."""
VERBOSE_VARIABLE = "FAST_VERBOSE"
"""1: every rank prints its records as lines on stderr."""
LABEL_VARIABLE = "FAST_RUN_LABEL"
"""What the progress bar calls the run (``fast run`` passes the strategy string)."""
BUDGET_SAMPLES_VARIABLE = "FAST_BUDGET_SAMPLES"
"""A shared work budget: train this many samples summed over all ranks, then stop (``fast_core.runtime.budget``)."""
BUDGET_SECONDS_VARIABLE = "FAST_BUDGET_SECONDS"
"""A shared work budget: train this many wall-clock seconds from the common start, then stop."""
FAULT_TOLERANT_VARIABLE = "FAST_FAULT_TOLERANT"
"""1: the job survives a lost rank; the default engine is then the fault-tolerant MPI engine, which needs Open MPI
with ULFM started by ``mpiexec --with-ft ulfm`` (``fast run --fault-tolerant`` sets both)."""
MAX_RESTARTS_VARIABLE = "FAST_MAX_RESTARTS"
"""Under FAST_FAULT_TOLERANT: how many lost ranks the job replaces with new processes (``fast run --max-restarts``)."""
MAX_RANKS_VARIABLE = "FAST_MAX_RANKS"
"""Under FAST_FAULT_TOLERANT: the most ranks the job may grow to when workers ask to join it (``fast run --max-ranks``,
``fast run --join``); 0: it never grows."""
INJECT_FAULTS_VARIABLE = "FAST_INJECT_FAULTS"
"""1: each rank turns its parameters NaN at the step after it gets SIGUSR1 (``benchmarks/chaos.py``'s NaN fault;
``fast_core.observers.fault_injection``)."""
RANK_PREFIX_VARIABLE = "FAST_RANK_PREFIX"
"""0: ``fast run`` shows the ranks' lines as they are, without ``[r] `` in front (``--no-rank-prefix``); read by
the launcher only."""
HEARTBEAT_VARIABLE = "FAST_HEARTBEAT_FD"
"""The pipe a rank beats on, which its guard watches (``fast run --freeze-timeout``; set by the guard, never by
hand: ``fast_core.runtime.heartbeat``)."""
GUARD_VARIABLE = "FAST_GUARD"
"""Set by ``fast run``'s guard (fast_core/cli/guard.py) for the rank below it: the guard's command line up to
``--``, as a JSON list, so that a replacement process is started below a guard of its own."""

DEFAULT_STRATEGY = "allreduce"
DEFAULT_TIMEOUT = 120.0
"""Seconds a rank waits for a peer before raising PeerTimeout."""
DEFAULT_LOG_EVERY = 10


@dataclass(frozen=True)
class RunConfig:
    """What a job's ranks are told from outside the script: strategy, timeout, straggler, reporting, budget."""

    strategy: str | None = None
    """The canonical text of a StrategySpec (``fast run`` parses ``--strategy`` once and writes ``str(spec)``); each
    rank parses it once (``strategies.spec.run_spec``). None: the script's own strategy."""
    topology: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    """Seconds any wait on a peer may last; ``math.inf`` waits forever (for debugging under a debugger)."""
    straggler: float | None = None
    """The relative straggler: its rank runs ``straggler`` times slower than its own measured compute."""
    straggler_rank: int | None = None
    straggler_seconds: float | None = None
    """The fixed straggler: its rank sleeps this many seconds per step (``fast bench`` calibrates it)."""
    run_dir: Path | None = None
    tensorboard: Path | None = None
    """Where the ranks write their records as TensorBoard scalars too (None: nowhere)."""
    log_every: int = DEFAULT_LOG_EVERY
    profile: bool = False
    """Whether each rank splits its wall-clock by phase into its close record (FAST_PROFILE, ``fast run --profile``)."""
    progress: bool = False
    verbose: bool = False
    label: str = ""
    budget_samples: int | None = None
    """Samples summed over all ranks after which every rank stops (None: no sample budget)."""
    budget_seconds: float | None = None
    """Wall-clock seconds from the common start after which every rank stops (None: no time budget)."""
    fault_tolerant: bool = False
    """Whether the job survives a lost rank (FAST_FAULT_TOLERANT): the default engine is then the fault-tolerant
    MPI engine."""
    max_restarts: int = 0
    """Lost ranks the fault-tolerant job replaces with new processes (FAST_MAX_RESTARTS); the others go on without."""
    max_ranks: int = 0
    """The most ranks the fault-tolerant job may grow to when workers ask to join (FAST_MAX_RANKS); 0: never."""
    inject_faults: bool = False
    """Whether SIGUSR1 turns this rank's parameters NaN at its next step (FAST_INJECT_FAULTS; chaos runs only)."""
    heartbeat_fd: int | None = None
    """The pipe this rank beats on for its guard (FAST_HEARTBEAT_FD), or None: no guard watches for a freeze."""

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> RunConfig:
        """Read and check every ``FAST_*`` variable (``os.environ`` unless ``env`` is given)."""
        env = os.environ if env is None else env

        def text(name: str) -> str:
            return env.get(name, "").strip()

        run_dir = text(RUN_DIR_VARIABLE)
        tensorboard = text(TENSORBOARD_VARIABLE)
        straggler = _straggler_factor(text(STRAGGLER_VARIABLE))
        straggler_seconds = _straggler_seconds(text(STRAGGLER_SECONDS_VARIABLE))
        if straggler is not None and straggler_seconds is not None:
            raise ConfigError(
                f"{STRAGGLER_VARIABLE} and {STRAGGLER_SECONDS_VARIABLE} are both set: give one, the factor (3: three "
                "times its own compute) or the fixed seconds slept per step"
            )
        return cls(
            strategy=text(STRATEGY_VARIABLE) or None,
            topology=text(TOPOLOGY_VARIABLE) or None,
            timeout=parse_timeout(text(TIMEOUT_VARIABLE)) if text(TIMEOUT_VARIABLE) else DEFAULT_TIMEOUT,
            straggler=straggler,
            straggler_rank=_whole(text(STRAGGLER_RANK_VARIABLE), STRAGGLER_RANK_VARIABLE, "1", minimum=0),
            straggler_seconds=straggler_seconds,
            run_dir=Path(run_dir) if run_dir else None,
            tensorboard=Path(tensorboard) if tensorboard else None,
            log_every=_whole(text(LOG_EVERY_VARIABLE), LOG_EVERY_VARIABLE, "10", minimum=1) or DEFAULT_LOG_EVERY,
            profile=_switch(text(PROFILE_VARIABLE)),
            progress=_switch(text(PROGRESS_VARIABLE)),
            verbose=_switch(text(VERBOSE_VARIABLE)),
            label=text(LABEL_VARIABLE),
            budget_samples=_whole(text(BUDGET_SAMPLES_VARIABLE), BUDGET_SAMPLES_VARIABLE, "20000", minimum=1),
            budget_seconds=parse_budget_seconds(text(BUDGET_SECONDS_VARIABLE)),
            fault_tolerant=_flag(text(FAULT_TOLERANT_VARIABLE), FAULT_TOLERANT_VARIABLE),
            max_restarts=_whole(text(MAX_RESTARTS_VARIABLE), MAX_RESTARTS_VARIABLE, "2", minimum=0) or 0,
            max_ranks=_whole(text(MAX_RANKS_VARIABLE), MAX_RANKS_VARIABLE, "8", minimum=0) or 0,
            inject_faults=_switch(text(INJECT_FAULTS_VARIABLE)),
            heartbeat_fd=_whole(text(HEARTBEAT_VARIABLE), HEARTBEAT_VARIABLE, "5", minimum=0),
        )

    def to_environment(self) -> dict[str, str]:
        """Every variable, set so that ``from_environment`` gives this configuration back whatever the environment
        held before (an empty value means "not given")."""
        return {
            STRATEGY_VARIABLE: self.strategy or "",
            TOPOLOGY_VARIABLE: self.topology or "",
            TIMEOUT_VARIABLE: "inf" if math.isinf(self.timeout) else repr(self.timeout),
            STRAGGLER_VARIABLE: "" if self.straggler is None else repr(self.straggler),
            STRAGGLER_RANK_VARIABLE: "" if self.straggler_rank is None else str(self.straggler_rank),
            STRAGGLER_SECONDS_VARIABLE: "" if self.straggler_seconds is None else repr(self.straggler_seconds),
            RUN_DIR_VARIABLE: "" if self.run_dir is None else str(self.run_dir),
            TENSORBOARD_VARIABLE: "" if self.tensorboard is None else str(self.tensorboard),
            LOG_EVERY_VARIABLE: str(self.log_every),
            PROFILE_VARIABLE: "1" if self.profile else "0",
            PROGRESS_VARIABLE: "1" if self.progress else "0",
            VERBOSE_VARIABLE: "1" if self.verbose else "0",
            LABEL_VARIABLE: self.label,
            BUDGET_SAMPLES_VARIABLE: "" if self.budget_samples is None else str(self.budget_samples),
            BUDGET_SECONDS_VARIABLE: "" if self.budget_seconds is None else repr(self.budget_seconds),
            FAULT_TOLERANT_VARIABLE: "1" if self.fault_tolerant else "0",
            MAX_RESTARTS_VARIABLE: str(self.max_restarts),
            MAX_RANKS_VARIABLE: str(self.max_ranks),
            INJECT_FAULTS_VARIABLE: "1" if self.inject_faults else "0",
            HEARTBEAT_VARIABLE: "" if self.heartbeat_fd is None else str(self.heartbeat_fd),
        }

    @property
    def reporting(self) -> bool:
        """True when records, TensorBoard scalars, a progress bar or verbose lines are asked for."""
        return self.run_dir is not None or self.tensorboard is not None or self.progress or self.verbose


def parse_timeout(text: str) -> float:
    """A FAST_TIMEOUT value: seconds > 0, or ``inf`` (never time out). ``abc``, ``nan``, ``0`` and ``-1`` are errors."""
    advice = (
        "give the seconds a rank may wait for a peer, a number > 0 such as 120 (or inf to wait forever, e.g. under a "
        "debugger)"
    )
    return _number(text, TIMEOUT_VARIABLE, lambda value: value > 0, advice)


def check_timeout(value: float) -> float:
    """A timeout given in code (``fast_core.init(timeout=...)``): the same rule as FAST_TIMEOUT."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"timeout={value!r}: give seconds > 0 (or math.inf to wait forever)")
    return float(value)


def parse_budget_seconds(text: str) -> float | None:
    """A FAST_BUDGET_SECONDS value: finite seconds > 0, or None when empty (``abc``, ``nan``, ``0``, ``-1`` and
    ``inf`` are errors)."""
    if not text:
        return None
    advice = "give the wall-clock seconds to train, > 0, e.g. 60"
    return _number(text, BUDGET_SECONDS_VARIABLE, lambda value: 0 < value < math.inf, advice)


def check_budget(samples: object, seconds: object) -> tuple[int | None, float | None]:
    """A budget given in code (``fast_core.Budget``): the same rules as its two variables, and at least one given."""
    if samples is None and seconds is None:
        raise ConfigError(
            "Budget(): give samples= (summed over all ranks) or seconds= (wall clock), e.g. Budget(samples=20000)"
        )
    if samples is not None and (not isinstance(samples, numbers.Integral) or isinstance(samples, bool) or samples < 1):
        raise ConfigError(
            f"Budget(samples={samples!r}): give a whole number of samples >= 1, summed over all ranks, "
            "e.g. Budget(samples=20000)"
        )
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not 0 < seconds < math.inf
    ):
        raise ConfigError(f"Budget(seconds={seconds!r}): give finite wall-clock seconds > 0, e.g. Budget(seconds=60)")
    return (None if samples is None else int(samples)), (None if seconds is None else float(seconds))


def rank_prefix(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``fast run`` puts each rank's number in front of its lines (FAST_RANK_PREFIX, default yes)."""
    text = (os.environ if env is None else env).get(RANK_PREFIX_VARIABLE, "").strip()
    return _flag(text, RANK_PREFIX_VARIABLE) if text else True


def guard_command(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The command line of the guard this rank runs below (FAST_GUARD), or None when it runs below none."""
    text = (os.environ if env is None else env).get(GUARD_VARIABLE, "").strip()
    if not text:
        return None
    try:
        command = json.loads(text)
    except ValueError:
        command = None
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise ConfigError(f"{GUARD_VARIABLE}={text!r}: fast run's guard sets it to a JSON list; unset it")
    return command


def _straggler_factor(text: str) -> float | None:
    if not text:
        return None
    advice = "give a slow-down factor >= 1, e.g. 3 for three times slower"
    return _number(text, STRAGGLER_VARIABLE, lambda factor: 1.0 <= factor < math.inf, advice)


def _straggler_seconds(text: str) -> float | None:
    if not text:
        return None
    advice = "give the seconds the straggler sleeps per step, >= 0, e.g. 0.01"
    return _number(text, STRAGGLER_SECONDS_VARIABLE, lambda seconds: 0 <= seconds < math.inf, advice)


def _number(text: str, name: str, accept: Callable[[float], bool], advice: str) -> float:
    """``text`` as a number ``accept`` takes (text that is no number counts as nan, which no comparison accepts),
    else one ConfigError line: ``NAME='text': advice``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not accept(value):
        raise ConfigError(f"{name}={text!r}: {advice}")
    return value


def _whole(text: str, name: str, example: str, minimum: int) -> int | None:
    if not text:
        return None
    if not text.isdigit() or int(text) < minimum:
        raise ConfigError(f"{name}={text!r}: give a whole number >= {minimum}, e.g. {example}")
    return int(text)


def _switch(text: str) -> bool:
    """A variable used as a switch: set and not 0/false/no."""
    return text.lower() not in ("", "0", "false", "no")


def _flag(text: str, name: str) -> bool:
    """A variable that is a yes/no choice with consequences: 1/true/yes or 0/false/no (empty: no), nothing else."""
    word = text.lower()
    if word in ("1", "true", "yes"):
        return True
    if word in ("", "0", "false", "no"):
        return False
    raise ConfigError(f"{name}={text!r}: give 1 (yes) or 0 (no)")
