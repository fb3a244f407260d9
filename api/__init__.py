"""FastAPI shell of the Shockwave service: routes, settings, tables, repository, errors."""
