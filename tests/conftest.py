import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fast_core.config.current import forget_run_config  # noqa: E402


@pytest.fixture(autouse=True)
def _each_test_reads_its_own_run_configuration():
    """A process reads its run configuration once (``fast_core.run_config()``); each test plays a new process, with
    the FAST_* variables it set."""
    forget_run_config()
    yield
    forget_run_config()
