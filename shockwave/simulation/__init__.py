"""Simulation: a workload run through a policy and the round engine on a virtual clock.

The discrete-event simulator (the same ``decide`` call and round engine as the service), the run
metrics, the prediction-accuracy report and the tenants' ledger of entitlement against receipt.
The top layer of the core: nothing in the core imports it.
"""
