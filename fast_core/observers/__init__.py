"""What watches a job without taking part in training: the run records and progress bar, the simulated straggler, the
parameter snapshots behind the consensus curve."""
