"""Job events, prediction, cluster, nodes, schedule and metrics endpoints.

Each test runs the app on a fresh SQLite file migrated through Alembic. Set
``SHOCKWAVE_UNIT_POSTGRES_URL`` (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test) to run
the same tests on Postgres, each in a throwaway schema that is dropped afterwards.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import create_engine, delete, inspect, text
from sqlmodel import Session

from api.app import create_app
from api.routes.prediction import get_now
from api.settings import Settings
from shockwave.domain.model import Regime
from shockwave.domain.observed import ClientEvent, Observed, fold, observe, regimes_of
from store import events as progress_module
from store import migrate
from store.paging import page_token
from store.principals import Role
from store.snapshot import load_snapshot
from store.tables import JobEventRow, NodeApprovalRow, NodeRow
from store.tokens import create_token

JOB = {
    "gpus": 1,
    "epochs": 10,
    "samples_per_epoch": 1000,
    "initial_batch_size": 32,
    "mode": "accordion",
    "batch_sizes": [32, 256],
    "throughput": {"32": 100.0},
}


def progress(seq: int, epoch: int, seconds: float = 10.0, batch_size: int = 32) -> dict[str, Any]:
    return {
        "seq": seq,
        "kind": "progress",
        "epoch": epoch,
        "samples": 1000,
        "seconds": seconds,
        "batch_size": batch_size,
    }


def scaling(seq: int, epoch: int, batch_size: int) -> dict[str, Any]:
    return {"seq": seq, "kind": "scaling", "epoch": epoch, "batch_size": batch_size}


@dataclass
class Api:
    client: TestClient
    url: str
    schema: str | None

    def session(self) -> Session:
        return Session(self.client.app.state.engine)  # type: ignore[attr-defined]

    def token(self, role: Role, **scope: Any) -> dict[str, str]:
        with self.session() as session:
            return {"Authorization": f"Bearer {create_token(session, role, **scope)}"}

    def submit(self, headers: dict[str, str] | None = None, **fields: Any) -> str:
        response = self.client.post("/v1/jobs", json={**JOB, **fields}, headers=headers)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def post(self, job_id: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        return self.client.post(f"/v1/jobs/{job_id}/events", json=body, headers=headers)


@pytest.fixture
def database(tmp_path: Any) -> Iterator[tuple[str, str | None]]:
    postgres = os.environ.get("SHOCKWAVE_UNIT_POSTGRES_URL")
    if not postgres:
        url = f"sqlite:///{tmp_path / 'api.db'}"
        migrate.upgrade(url)
        yield url, None
        return
    schema = f"unit_{secrets.token_hex(4)}"
    migrate.upgrade(postgres, schema=schema)
    yield postgres, schema
    engine = create_engine(postgres, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    engine.dispose()


@pytest.fixture
def api(database: tuple[str, str | None]) -> Iterator[Api]:
    url, schema = database
    app = create_app(Settings(database_url=url, database_schema=schema, open_mode=True))
    with TestClient(app) as client:
        yield Api(client, url, schema)
    app.state.engine.dispose()


def test_duplicate_seq_replays_the_stored_event(api: Api) -> None:
    job = api.submit()
    first = api.post(job, progress(1, 1))
    again = api.post(job, progress(1, 1))
    assert first.status_code == 201
    assert first.headers["location"] == f"/v1/jobs/{job}/events/{first.json()['id']}"
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert api.client.get(f"/v1/jobs/{job}").json()["attained_s"] == 10.0


def test_same_seq_with_another_body_is_a_conflict_naming_seq(api: Api) -> None:
    job = api.submit()
    api.post(job, progress(1, 1, seconds=10.0))
    response = api.post(job, progress(1, 1, seconds=11.0))
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["errors"] == [{"field": "seq", "message": response.json()["detail"]}]
    kind_changed = api.post(job, scaling(1, 0, 64))
    assert kind_changed.status_code == 409


def test_reordered_events_never_move_the_observed_state_backwards(api: Api) -> None:
    job = api.submit()
    assert api.post(job, progress(2, 2, seconds=9.0)).status_code == 201
    assert api.post(job, progress(1, 1, seconds=11.0)).status_code == 201
    state = api.client.get(f"/v1/jobs/{job}").json()
    assert state["epochs_done"] == 2
    assert state["attained_s"] == 20.0
    assert state["measured_epoch_seconds"] == {"32": 10.0}
    assert api.post(job, scaling(4, 5, 256)).status_code == 201
    assert api.post(job, scaling(3, 2, 64)).status_code == 201
    state = api.client.get(f"/v1/jobs/{job}").json()
    assert state["batch_size"] == 256


def test_finished_job_takes_no_new_events_but_replays_old_ones(api: Api) -> None:
    job = api.submit()
    api.post(job, progress(1, 1))
    assert api.client.post(f"/v1/jobs/{job}/cancel").status_code == 200
    assert api.post(job, progress(2, 2)).status_code == 409
    assert api.post(job, progress(1, 1)).status_code == 200


def test_who_may_post_events(api: Api) -> None:
    mine = api.submit(tenant="a")
    theirs = api.submit(tenant="b")
    job_token = api.token(Role.JOB, job_id=mine)
    assert api.post(mine, progress(1, 1), job_token).status_code == 201
    assert api.post(theirs, progress(1, 1), job_token).status_code == 404
    assert api.post(mine, progress(2, 2), api.token(Role.USER, tenant="a")).status_code == 201
    assert api.post(mine, progress(3, 3), api.token(Role.USER, tenant="b")).status_code == 404
    assert api.post(mine, progress(3, 3), api.token(Role.AGENT, node="n1")).status_code == 403
    assert api.post("no-such-job", progress(1, 1)).status_code == 404
    unauthenticated = api.post(mine, progress(3, 3), {"Authorization": "Bearer nope"})
    assert unauthenticated.status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**progress(1, 1), "epoch": 0}, "progress.epoch"),
        ({**progress(1, 1), "seq": 0}, "progress.seq"),
        ({**progress(1, 1), "seconds": 0}, "progress.seconds"),
        ({**progress(1, 1), "samples": 2**31}, "progress.samples"),
        ({**progress(1, 1), "extra": 1}, "progress.extra"),
        ({**scaling(1, 0, 64), "batch_size": 0}, "scaling.batch_size"),
        ({"seq": 1, "kind": "nonsense"}, "body"),
        (progress(1, 11), "progress.epoch"),
        (scaling(1, 10, 64), "scaling.epoch"),
    ],
)
def test_invalid_events_are_422_naming_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    job = api.submit()
    response = api.post(job, body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in response.json()["errors"]] == [field]
    assert api.client.get(f"/v1/jobs/{job}/events", params={"kind": "progress"}).json() == {
        "items": [],
        "next_page_token": None,
    }


def test_non_finite_seconds_are_rejected(api: Api) -> None:
    job = api.submit()
    raw = (
        '{"seq": 1, "kind": "progress", "epoch": 1, "samples": 1, "seconds": Infinity,'
        ' "batch_size": 32}'
    )
    response = api.client.post(
        f"/v1/jobs/{job}/events", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "progress.seconds"


def test_idempotency_key_replays_the_first_response(api: Api) -> None:
    job = api.submit()
    key = {"Idempotency-Key": "event-1"}
    first = api.post(job, progress(1, 1), key)
    again = api.post(job, progress(1, 1), key)
    other = api.post(job, progress(2, 2), key)
    assert (first.status_code, again.status_code, other.status_code) == (201, 201, 422)
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]


def test_concurrent_duplicates_store_one_event(api: Api) -> None:
    job = api.submit()

    def post(_: int) -> tuple[int, int]:
        response = api.post(job, progress(1, 1))
        return response.status_code, response.json()["id"]

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(post, range(12)))
    assert sorted(status for status, _ in results) == [200] * 11 + [201]
    assert len({event_id for _, event_id in results}) == 1
    assert api.client.get(f"/v1/jobs/{job}").json()["attained_s"] == 10.0


def test_events_list_in_pages_in_stored_order(api: Api) -> None:
    job = api.submit()
    for seq in (3, 1, 2):
        api.post(job, progress(seq, seq))
    seen: list[int | None] = []
    token = None
    while True:
        params: dict[str, Any] = {"page_size": 2}
        if token:
            params["page_token"] = token
        page = api.client.get(f"/v1/jobs/{job}/events", params=params).json()
        seen += [e["seq"] for e in page["items"]]
        token = page["next_page_token"]
        if token is None:
            break
    assert seen == [None, 3, 1, 2]
    bad = api.client.get(f"/v1/jobs/{job}/events", params={"page_token": "garbage!"})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "page_token"
    one = api.client.get(f"/v1/jobs/{job}/events/{page['items'][-1]['id']}")
    assert one.json()["seq"] == 2
    assert api.client.get(f"/v1/jobs/{job}/events/999999").status_code == 404


def test_the_snapshot_reads_the_folded_state_not_the_events(api: Api) -> None:
    """The planner's snapshot and the API see a job through the same folded state, kept on
    its row: with the events themselves gone, the snapshot still knows the regimes."""
    job = api.submit()
    for body in (progress(1, 1, 10.0), progress(2, 2, 12.0), scaling(3, 2, 256)):
        assert api.post(job, body).status_code == 201
    assert api.post(job, progress(4, 3, 4.0, batch_size=256)).status_code == 201
    with api.session() as session:
        session.add(NodeRow(id="n1", hostname="gpu-1", gpus=2))
        session.add(NodeApprovalRow(node_id="n1", gpus=2))
        session.exec(delete(JobEventRow))
        session.commit()
        snapshot, _ = load_snapshot(session, "default", 0, datetime.now(UTC))
    (seen,) = snapshot.jobs
    assert seen.progress.observed_regimes == (Regime(32, 2),)
    assert (seen.progress.batch_size, seen.progress.epochs_done) == (256, 3.0)
    assert dict(seen.progress.measured_epoch_seconds) == {32: 11.0, 256: 4.0}
    assert seen.progress.attained_s == 26.0


def test_prediction_returns_regimes_remaining_time_and_ftf(api: Api) -> None:
    job = api.submit()
    api.post(job, progress(1, 1, seconds=10.0))
    api.post(job, progress(2, 2, seconds=10.0))
    api.post(job, scaling(3, 2, 256))
    api.post(job, progress(4, 3, seconds=2.0, batch_size=256))
    created = api.client.get(f"/v1/jobs/{job}").json()["created_at"]
    api.client.app.dependency_overrides[get_now] = lambda: (  # type: ignore[attr-defined]
        _parse(created) + timedelta(seconds=100)
    )
    body = api.client.get(f"/v1/jobs/{job}/prediction").json()
    assert [(r["batch_size"], r["phase"]) for r in body["regimes"]] == [
        (32, "past"),
        (256, "current"),
    ]
    assert body["regimes"][0]["epochs"] == 2
    assert body["regimes"][1]["epoch_seconds"] == 2.0
    assert body["remaining_seconds"] == pytest.approx(7 * 2.0)
    assert body["total_seconds"] == pytest.approx(2 * 10.0 + 8 * 2.0)
    assert body["contention"] == 1.0
    assert body["ftf_estimate"] == pytest.approx((100 + 14) / 36)
    assert body["planned_rounds"] == []
    assert body["cause"] == "no_ready_node", "no node at all is said before anything of plans"
    assert "no node is READY" in body["reason"]


def test_prediction_of_a_fresh_job_uses_declared_throughput(api: Api) -> None:
    job = api.submit()
    body = api.client.get(f"/v1/jobs/{job}/prediction").json()
    assert [r["batch_size"] for r in body["regimes"]] == [32, 256]
    assert body["regimes"][0]["epoch_seconds_source"] == "declared"
    assert body["regimes"][1]["epoch_seconds_source"] == "estimated"
    assert body["remaining_seconds"] == pytest.approx(body["total_seconds"])
    other_tenant = api.token(Role.USER, tenant="elsewhere")
    assert api.client.get(f"/v1/jobs/{job}/prediction", headers=other_tenant).status_code == 404


def test_cluster_nodes_and_contention(api: Api) -> None:
    with api.session() as session:
        session.add(NodeRow(id="n1", hostname="gpu-1", gpus=1, gpu_type="A100"))
        session.add(NodeApprovalRow(node_id="n1", gpus=1))
        session.add(NodeRow(id="n2", hostname="gpu-2", gpus=4, state="LOST"))
        session.add(NodeApprovalRow(node_id="n2", gpus=4))
        session.commit()
    user = api.token(Role.USER, tenant="a")
    api.submit(user)
    api.submit(user)
    api.submit(tenant="b")
    admin_view = api.client.get("/v1/cluster").json()
    assert admin_view["total_gpus"] == 5
    assert admin_view["ready_gpus"] == 1
    assert admin_view["nodes"] == {"READY": 1, "LOST": 1}
    assert admin_view["jobs"]["PENDING"] == 3
    user_view = api.client.get("/v1/cluster", headers=user).json()
    assert (user_view["nodes"], user_view["jobs"]["PENDING"], user_view["tenant"]) == (None, 2, "a")
    nodes = api.client.get("/v1/nodes", params={"page_size": 1}).json()
    assert nodes["items"][0]["hostname"] == "gpu-1"
    rest = api.client.get("/v1/nodes", params={"page_token": nodes["next_page_token"]}).json()
    assert [n["id"] for n in rest["items"]] == ["n2"]
    summary = api.client.get("/v1/nodes", headers=user).json()["items"]
    assert summary == [
        {"id": "n1", "gpus": 1, "state": "READY"},
        {"id": "n2", "gpus": 4, "state": "LOST"},
    ]
    lost = api.client.get("/v1/nodes", params={"state": "LOST"}).json()["items"]
    assert [n["id"] for n in lost] == ["n2"]
    with api.session() as session:
        session.add(NodeRow(id="n3", hostname="rogue", gpus=1024))  # not approved: no GPU
        session.commit()
    after = api.client.get("/v1/cluster").json()
    assert (after["total_gpus"], after["ready_gpus"], after["nodes"]["READY"]) == (5, 1, 2)
    job = api.submit()
    assert api.client.get(f"/v1/jobs/{job}/prediction").json()["contention"] == 4.0
    job_token = api.token(Role.JOB, job_id=job)
    assert api.client.get("/v1/nodes", headers=job_token).status_code == 403


def test_schedule_says_no_round_has_run(api: Api) -> None:
    assert api.client.get("/v1/schedule").json() == {
        "round": None,
        "plan": None,
        "reason": "no round driver has run yet",
    }


def test_metrics_count_requests_by_route_template(api: Api) -> None:
    job = api.submit()
    api.post(job, progress(1, 1))
    api.post(job, progress(1, 1))
    api.client.get("/no/such/path")
    response = api.client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text_ = response.text
    assert (
        'shockwave_http_requests_total{method="POST",route="/v1/jobs/{job_id}/events",'
        'status="201"} 1.0' in text_
    )
    assert 'route="unmatched",status="404"' in text_
    assert job not in text_
    assert 'shockwave_job_events_total{kind="progress",outcome="replayed"} 1.0' in text_
    assert 'shockwave_jobs{state="PENDING"} 1.0' in text_
    assert "shockwave_http_request_duration_seconds_bucket" in text_
    assert "shockwave_database_up 1.0" in text_


def test_openapi_documents_problem_responses(api: Api) -> None:
    paths = api.client.get("/openapi.json").json()["paths"]
    post = paths["/v1/jobs/{job_id}/events"]["post"]
    assert {"200", "201", "409", "422"} <= set(post["responses"])
    assert "application/problem+json" in post["responses"]["409"]["content"]
    assert "/v1/jobs/{job_id}/prediction" in paths
    assert {"/v1/cluster", "/v1/nodes", "/v1/schedule", "/metrics"} <= set(paths)


def test_migration_0002_upgrades_and_downgrades(database: tuple[str, str | None]) -> None:
    url, schema = database
    migrate.downgrade(url, schema, revision="0001")
    assert _tables_and_job_columns(url, schema)[0] >= {"jobs"}
    assert "nodes" not in _tables_and_job_columns(url, schema)[0]
    assert "measured_epoch_seconds" not in _tables_and_job_columns(url, schema)[1]
    migrate.upgrade(url, schema)
    tables, columns = _tables_and_job_columns(url, schema)
    assert "nodes" in tables
    assert "measured_epoch_seconds" in columns
    migrate.downgrade(url, schema)
    assert _tables_and_job_columns(url, schema)[0] <= {"alembic_version"}
    migrate.upgrade(url, schema)


@pytest.mark.parametrize(
    ("scalings", "regimes", "current"),
    [
        ([], (), 32),
        ([(2, 1, 256)], (Regime(32, 2),), 256),
        ([(0, 1, 64)], (), 64),
        ([(5, 2, 64), (2, 1, 32)], (Regime(32, 5),), 64),
        ([(5, 1, 64), (5, 2, 128)], (Regime(32, 5),), 128),
        ([(5, 1, 64), (5, 2, 32)], (), 32),
        ([(2, 1, 64), (6, 2, 32)], (Regime(32, 2), Regime(64, 4)), 32),
    ],
)
def test_regimes_are_cut_where_the_batch_size_changes(
    scalings: list[tuple[int, int, int]], regimes: tuple[Regime, ...], current: int
) -> None:
    assert regimes_of(32, scalings) == (regimes, current)


def test_observe_is_order_independent() -> None:
    events = [
        ClientEvent(1, "progress", {"epoch": 1, "seconds": 4.0, "batch_size": 32}),
        ClientEvent(2, "progress", {"epoch": 2, "seconds": 6.0, "batch_size": 32}),
        ClientEvent(3, "scaling", {"epoch": 2, "batch_size": 64}),
        ClientEvent(4, "progress", {"epoch": 3, "seconds": 3.0, "batch_size": 64}),
    ]
    forward, backward = observe(32, events), observe(32, reversed(events))
    assert forward == backward
    assert (forward.epochs_done, forward.batch_size, forward.attained_s) == (3, 64, 13.0)
    assert dict(forward.measured_epoch_seconds) == {32: 5.0, 64: 3.0}
    assert forward.observed_regimes == (Regime(32, 2),)
    assert forward.last_seq == 4


EVENTS = st.lists(
    st.one_of(
        st.tuples(
            st.just("progress"),
            st.integers(1, 20),
            st.integers(1, 600),
            st.sampled_from([16, 32, 64, 128]),
        ),
        st.tuples(
            st.just("scaling"), st.integers(0, 19), st.just(0), st.sampled_from([16, 32, 64])
        ),
    ),
    max_size=24,
)


@given(EVENTS, st.randoms(use_true_random=False))
def test_folding_events_one_by_one_gives_the_same_state_in_any_order(
    raw: list[tuple[str, int, int, int]], rng: Any
) -> None:
    """One rule for the API and the snapshot: each event folded in with constant work, and the
    state does not depend on the order the events arrive in (whole seconds keep the sums
    exact)."""
    events = [
        ClientEvent(
            seq,
            kind,
            {"epoch": epoch, "seconds": float(seconds), "batch_size": bs}
            if kind == "progress"
            else {"epoch": epoch, "batch_size": bs},
        )
        for seq, (kind, epoch, seconds, bs) in enumerate(raw, start=1)
    ]
    shuffled = list(events)
    rng.shuffle(shuffled)
    in_order, any_order = observe(32, events), observe(32, shuffled)
    assert any_order == in_order
    progress_events = [e for e in events if e.kind == "progress"]
    scalings = [
        (e.payload["epoch"], e.seq, e.payload["batch_size"]) for e in events if e.kind == "scaling"
    ]
    assert in_order.epochs_done == max((e.payload["epoch"] for e in progress_events), default=0)
    assert in_order.attained_s == sum(e.payload["seconds"] for e in progress_events)
    assert (in_order.observed_regimes, in_order.batch_size) == regimes_of(32, scalings)
    assert in_order.last_seq == len(events)
    for bs, mean in in_order.measured_epoch_seconds.items():
        at = [e.payload["seconds"] for e in progress_events if e.payload["batch_size"] == bs]
        assert mean == sum(at) / len(at)


def test_a_fold_adds_one_event_to_a_stored_state() -> None:
    stored = Observed(32, epochs_done=2, attained_s=20.0, epoch_seconds={32: (20.0, 2)}, last_seq=2)
    after = fold(
        stored, ClientEvent(3, "progress", {"epoch": 3, "seconds": 13.0, "batch_size": 32})
    )
    assert (after.epochs_done, after.attained_s, after.last_seq) == (3, 33.0, 3)
    assert dict(after.measured_epoch_seconds) == {32: 11.0}
    scaled = fold(after, ClientEvent(4, "scaling", {"epoch": 3, "batch_size": 64}))
    assert scaled.batch_size == 64 and scaled.observed_regimes == (Regime(32, 3),)


def _tables_and_job_columns(url: str, schema: str | None) -> tuple[set[str], set[str]]:
    engine = create_engine(url)
    try:
        inspector = inspect(engine)
        tables = set(inspector.get_table_names(schema=schema))
        columns = (
            {c["name"] for c in inspector.get_columns("jobs", schema=schema)}
            if "jobs" in tables
            else set()
        )
        return tables, columns
    finally:
        engine.dispose()


def _parse(timestamp: str) -> datetime:
    moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def test_a_duplicate_that_slips_past_the_check_is_settled_by_the_constraint(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A concurrent twin commits between our lookup and our insert: the unique (job, seq)
    constraint refuses the insert and the post answers as a duplicate would."""
    job = api.submit()
    first = api.post(job, progress(1, 1)).json()
    real = progress_module._event_at
    lookups: list[int] = []

    def first_lookup_misses(session: Session, job_id: str, seq: int) -> Any:
        lookups.append(seq)
        return None if len(lookups) == 1 else real(session, job_id, seq)

    monkeypatch.setattr(progress_module, "_event_at", first_lookup_misses)
    assert api.post(job, progress(1, 1)).json()["id"] == first["id"]
    assert len(lookups) == 2
    lookups.clear()
    assert api.post(job, progress(1, 1, seconds=3.0)).status_code == 409
    assert len(lookups) == 2
    lookups.clear()
    keyed = api.post(job, progress(1, 1), {"Idempotency-Key": "retry-1"})
    assert (keyed.status_code, keyed.json()["id"]) == (200, first["id"])
    replayed = api.post(job, progress(1, 1), {"Idempotency-Key": "retry-1"})
    assert replayed.json() == keyed.json()
    assert api.client.get(f"/v1/jobs/{job}").json()["attained_s"] == 10.0


@pytest.mark.parametrize(
    ("method", "path", "params", "field"),
    [
        ("POST", "/v1/jobs/a%00b/events", None, "path.job_id"),
        ("GET", "/v1/jobs/a%00b/events", None, "path.job_id"),
        ("GET", "/v1/jobs/a%00b/prediction", None, "path.job_id"),
        ("GET", "/v1/nodes", {"page_token": "bm9kZTphAGI"}, "page_token"),
    ],
)
def test_nul_bytes_are_a_422_not_a_500(
    api: Api, method: str, path: str, params: dict[str, str] | None, field: str
) -> None:
    response = api.client.request(method, path, params=params, json=progress(1, 1))
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == field


def test_ids_beyond_the_id_column_are_a_422(api: Api) -> None:
    job = api.submit()
    too_big = api.client.get(f"/v1/jobs/{job}/events/{2**31}")
    assert too_big.status_code == 422
    token = page_token("event", str(2**31))
    page = api.client.get(f"/v1/jobs/{job}/events", params={"page_token": token})
    assert page.status_code == 422
    assert page.json()["errors"][0]["field"] == "page_token"
