"""The process solver's child starts and imports the planner before the first plan request."""

from __future__ import annotations

from pathlib import Path

from shockwave_cli.runtime import embedded
from solver_service import enqueue
from solver_service.settings import SolverSettings
from store import migrate


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


def test_shockwave_up_with_a_solver_process_serves_once_the_solver_is_warm(
    tmp_path: Path,
) -> None:
    """``shockwave up --solver process`` comes up ready to plan: its first jobs are not run
    first in, first out while the child imports the planner."""
    config = embedded.EmbeddedConfig(database=tmp_path / "db.sqlite", port=0, solver="process")
    migrate.upgrade(config.database_url)
    service = embedded.Embedded(config)
    with embedded.claim(config) as listener:
        try:
            service.start(listener)
            requester = enqueue.install(None)
            enqueue.install(requester)
            assert isinstance(requester, enqueue.ProcessRequester)
            assert requester.warm(0.0), "start returned before the solver child was ready"
        finally:
            service.stop.set()
            service.close()
