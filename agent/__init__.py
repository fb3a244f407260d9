"""The node agent: the shell that runs Shockwave's leases on one GPU machine.

It registers the machine, heartbeats, polls its leases, starts, extends and stops the jobs'
processes (or containers) and reports what happened to each attempt.

- :mod:`agent.config`: the agent's settings and what it finds out about the machine (GPUs,
  Docker).
- :mod:`agent.client`: the /v1/agent API over HTTP, and the backoff between failed contacts.
- :mod:`agent.runtime`: starting, signalling and watching a job as a process or a container.
- :mod:`agent.wrap`: the tiny wrapper every process runs under, recording its exit status.
- :mod:`agent.state`: the state file that lets a restarted agent re-attach to its processes.
- :mod:`agent.loop`: the agent loop itself.
"""
