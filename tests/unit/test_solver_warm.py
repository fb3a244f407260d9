"""The process solver's child starts and imports the planner before the first plan request."""

from __future__ import annotations

from pathlib import Path

from solver_service import enqueue
from solver_service.settings import SolverSettings


def test_the_process_solver_is_warm_before_any_request(tmp_path: Path) -> None:
    settings = SolverSettings(
        solver_mode="process",
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        database_schema=None,
    )
    requester = enqueue.make_requester(settings)
    assert isinstance(requester, enqueue.ProcessRequester)
    try:
        # No request was made: the child was spawned by the constructor and has imported the
        # planner (the replay's first 470 to 2,230 simulated seconds ran first in, first out
        # while a child spawned at the first request loaded).
        assert requester.warm(120.0), "the solver child did not start"
    finally:
        requester.close()
