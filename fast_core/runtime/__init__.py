"""The job runtime: the Worker (a step clock and two hooks), the shared work budget, recovery from a lost rank,
checkpoints, the start-up agreement and this process's engine (``process.init``)."""
