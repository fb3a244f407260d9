"""The market: what a job's GPU time is worth, and the plan over a window of rounds.

The long-term fairness and efficiency estimators, the window planner (Nash social welfare:
the greedy and the exact SCIP model), elastic widths, and per-GPU-type speeds (the yardsticks a
typed market prices). Above prediction and the workloads; the policies put it to use.
"""
