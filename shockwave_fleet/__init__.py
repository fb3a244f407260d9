"""The simulated fleet: node agents and training programs on one asyncio loop, over a lean
keep-alive HTTP client.

``shockwave replay`` and the scale and load benches drive the real service with it. Like the
agent and the SDK it speaks HTTP only (the contract in pyproject.toml): it imports the core's
values and nothing of the server side, so what it exercises is the service's public protocol.
"""
