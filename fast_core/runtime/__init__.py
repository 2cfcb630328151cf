"""The job runtime: one rank's training lifecycle, and the parts it is wired from.

The shape, and why. A ``Worker`` (``worker.py``) is the training loop's clock and its two hooks, nothing more: its
ten public members are the lifecycle a training script or a framework adapter drives, in order ``start``,
``claim_batch``, ``before_step``, ``after_step`` (or both as ``run_step``), ``end_epoch``, ``join`` (uneven inputs),
``resume`` (a checkpoint), ``close``, and ``step``, the clock. Like Horovod's DistributedOptimizer or torchft's
optimizer wrapper, it is what the training loop calls; what is not a step of that loop hangs off it as a part, each
with one job, as torchft keeps its Manager beside the optimizer and Horovod its collectives beside the optimizer:

- ``worker.group`` (``group.py``): the ranks training together, collectives over all of them that survive a lost
  rank (``collective``), the consensus model (``average_params``, ``consensus_distance``) and the losses survived;
  the recovery itself (``survival.py``) works on its own small state (engine, context, strategy, allowance);
- ``worker.claims`` (``claims.py``): the shared work budget (``budget.py``) as this rank claims it;
- ``worker.records`` (``recorder.py``): what the script tells the observers (step, epoch, consensus and result
  records) and ``worker.observers``: who hears the event records (``fast_core.observers``, a layer below this one:
  observers are given event records and what they need at construction, never the Worker).

``builder.py`` wires these parts from the model, the strategy (resolved once), the engine (metered), the run
configuration and the options; ``Worker(model, strategy, engine, ...)`` calls it. Around them: the start-up agreement
(``agreement.py``), checkpoints (``checkpoint.py``), this process's engine (``process.py``), and the helpers a script
calls with its worker (``summaries.py``, ``consensus_curve.py``). Nothing here imports upward, type hints included.
"""
