"""Built-in policies. Importing this package registers each of them by name."""

from shockwave.policies.fifo import Fifo
from shockwave.policies.gavel_family.allox import Allox
from shockwave.policies.gavel_family.gandiva_fair import GandivaFair
from shockwave.policies.gavel_family.gavel import MaxMinFairness
from shockwave.policies.gavel_family.mst import MaxSumThroughput
from shockwave.policies.gavel_family.ossp import Ossp
from shockwave.policies.gavel_family.themis import Themis
from shockwave.policies.policy import register
from shockwave.policies.pollux import Pollux
from shockwave.policies.shockwave_market.shockwave import Shockwave

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
