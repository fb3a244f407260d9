"""The domain: the values and state machines every other layer speaks.

Jobs, regimes and clusters (``model``), the job, lease and node lifecycles, what a policy may
see at a round boundary (``snapshot``), a job's stints and the useful time they give, tenants
and their shares (``tenancy``), client events folded into what a job reports (``observed``), the
population prior of finished jobs, why a job waits, image references, the JSON codec of policy
state, and the memos that keep repeated per-round work cheap (``memo``). The bottom layer: it
imports nothing else of the core, so each rule here has one definition that the simulator and
the service both use.
"""
