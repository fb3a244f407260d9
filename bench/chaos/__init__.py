"""Fault injection for the distributed deployment: ``python -m bench.chaos`` (see
:mod:`bench.chaos.__main__` and docs/reliability.md).

Modules: :mod:`~bench.chaos.cluster` (the processes), :mod:`~bench.chaos.agent` (a simulated
agent as a killable process), :mod:`~bench.chaos.client` (round-robin HTTP with retries),
:mod:`~bench.chaos.workload` (jobs and events), :mod:`~bench.chaos.faults` (what is killed),
:mod:`~bench.chaos.invariants` (what must hold), :mod:`~bench.chaos.run` (the timeline) and
:mod:`~bench.chaos.report` (the table and the JSON).
"""
