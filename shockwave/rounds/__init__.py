"""The round engine: from a plan and the cluster at an instant, each round's leases.

One pure rule (``engine``) called by the simulator and the service's round driver alike, and
placement (``placement``, ``typed_placement``): which GPUs each chosen gang runs on. It takes a
policy's plan as plain values, so it knows no policy; policies may use its rules.
"""
