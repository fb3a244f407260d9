"""Built-in policies. Importing this package registers each of them by name."""

from shockwave.policies.allox import Allox
from shockwave.policies.fifo import Fifo
from shockwave.policies.gandiva_fair import GandivaFair
from shockwave.policies.gavel import MaxMinFairness
from shockwave.policies.mst import MaxSumThroughput
from shockwave.policies.ossp import Ossp
from shockwave.policies.pollux import Pollux
from shockwave.policies.shockwave import Shockwave
from shockwave.policies.themis import Themis
from shockwave.policy import register

BASELINES = ("fifo", "gavel", "mst", "themis", "allox", "gandiva_fair", "ossp")
"""The paper's baselines (plus FIFO), in the order tables list them."""

for _policy in (
    Fifo(),
    MaxMinFairness(),
    MaxSumThroughput(),
    Themis(),
    Allox(),
    GandivaFair(),
    Ossp(),
    Shockwave(),
    Pollux(),
):
    register(_policy)

__all__ = ["BASELINES"]
