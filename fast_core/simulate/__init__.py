"""``fast simulate``: hundreds of workers in one process on virtual time, running FAST's strategies unchanged.

The engine (``SimEngine``) is FAST's messaging protocol with messages that land when a link model says and
collectives that cost what their algorithm costs; a scheduler runs the workers' threads one at a time in the order
of their virtual clocks; a runner trains a real NumPy model and measures the consensus model against virtual time.
"""

from fast_core.simulate.engine import SimCluster, SimEngine
from fast_core.simulate.links import LinkModel, parse_rate
from fast_core.simulate.run import CurvePoint, Simulation, SimulationResult, simulate
from fast_core.simulate.speeds import ComputeTimes

__all__ = [
    "ComputeTimes",
    "CurvePoint",
    "LinkModel",
    "SimCluster",
    "SimEngine",
    "Simulation",
    "SimulationResult",
    "parse_rate",
    "simulate",
]
