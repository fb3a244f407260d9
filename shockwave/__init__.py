"""The scheduling core: pure values and rules, no I/O, no clock, no shell.

Its subpackages are its layers, top to bottom; a module imports only from its own layer and the
layers below it (the import-linter contract "The core's layers" in pyproject.toml):

- ``simulation``: the trace-driven simulator on a virtual clock, its metrics and reports.
- ``policies``: the one policy interface and registry; the Shockwave policy
  (``shockwave_market``), the Gavel family over its shared time-fraction adapter
  (``gavel_family``), FIFO and Pollux.
- ``rounds``: the round engine (which leases a round issues, extends and revokes) and placement.
- ``market``: what the market prices: the fairness estimators, the window planner (greedy and
  SCIP), elastic widths and per-type speeds.
- ``prediction``: a job's future batch-size regimes and its epoch times where it has not run.
- ``workloads``: job mixes with their true trajectories: the trace formats, the generator, the
  job-log import, variation and the users' throughput declarations.
- ``domain``: the values everyone speaks: jobs, clusters, lifecycles, snapshots, stints,
  tenants, client events, the population prior, why a job waits.

The shells (``store``, ``api``, ``solver_service``, the command line) hand it plain values and
store what it returns.
"""
