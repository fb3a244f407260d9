"""The Gavel family: baselines that compute a time-fraction allocation per job.

Max-min fairness (``gavel``, and ``gavel_typed`` on a typed cluster), max-sum-throughput
(``mst``), Themis, AlloX, Gandiva-Fair and OSSP each decide what share of the GPUs a job
should get over time; ``time_fraction`` is the one round-based mechanism, Gavel's, that turns
those shares into this round's jobs. Registered by name in ``shockwave.policies``.
"""
