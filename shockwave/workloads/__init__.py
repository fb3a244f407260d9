"""Workloads: the jobs a run is given, with the ground truth only the simulator reads.

A workload (job specs plus each job's true batch-size trajectory), the Gavel-format trace,
trajectory and throughput files, the seeded generator of the paper's job mix, the import of a
production job log, variation from the declared figures, what users declare about throughput
and the tenants of a simulated workload. Just above the domain: the market and the prediction
layers may read a workload's values, a workload never reads theirs.
"""
