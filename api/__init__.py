"""FastAPI shell of the Shockwave service: the app factory, routes, schemas, authentication, the
agent protocol and problem+json at the edge; the data it serves is the data layer's (``store``)."""
