"""What operators and integrators read, on Postgres and SQLite: the OpenAPI document made for
generators, the offline docs and the dashboard's files, "why am I waiting" by the core's rule,
the event stream (scoped by tenant, resumable), the queue and the rounds, preemption reasons,
and the output tails agents ship with their polls."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi.testclient import TestClient

from tests.integration.api_calls import bearer
from tests.integration.conftest import NODE, Database, Tokens
from tests.integration.driving import (
    ROUND_S,
    driver_on,
    leases,
    now,
    register,
    report,
    store_plan,
    submit,
)


def events_of(client: TestClient, token: str, **params: Any) -> list[dict[str, Any]]:
    """The stream's events, read without following (``follow=false``)."""
    headers = bearer(token)
    last = params.pop("last_event_id", None)
    if last is not None:
        headers["Last-Event-ID"] = str(last)
    response = client.get("/v1/events", params={"follow": "false", **params}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in response.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            event = json.loads(lines["data"])
            assert lines["id"] == str(event["id"]) and lines["event"] == event["kind"]
            events.append(event)
    return events


def test_the_openapi_document_is_made_for_generators(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    scheme = document["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    ids = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            ident = operation["operationId"]
            ids.append(ident)
            assert re.fullmatch(r"[a-z]+(?:[A-Z][a-z]*)*", ident), (method, path, ident)
            needs_token = operation["x-access"]["anonymous"] == "token"
            assert operation["security"] == ([{"bearerAuth": []}] if needs_token else [])
    assert len(ids) == len(set(ids))
    assert {"submitJob", "listJobs", "getJob", "cancelJob", "streamEvents"} <= set(ids)
    assert document["paths"]["/healthz"]["get"]["security"] == []
    job = document["components"]["schemas"]["JobCreate"]
    assert job["properties"]["gpus"]["enum"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert job["examples"][0]["gpus"] in (1, 2, 4, 8)


def test_docs_and_dashboard_are_served_from_here(client: TestClient) -> None:
    for page, asset in (
        ("/docs", "/static/docs/swagger-ui-bundle.js"),
        ("/redoc", "/static/docs/redoc.standalone.js"),
        ("/", "/static/dashboard/dashboard.js"),
    ):
        html = client.get(page)
        assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
        assert asset in html.text, page
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", html.text), page
        assert client.get(asset).status_code == 200, asset


def test_why_waiting_says_no_node_is_ready_before_anything_about_plans(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    job = submit(client, tokens.user_a)
    before = client.get(f"/v1/jobs/{job}/prediction", headers=bearer(tokens.user_a)).json()
    assert before["cause"] == "no_ready_node", before
    assert "no node is READY" in before["reason"]

    register(client, tokens.agent, gpus=1)
    wide = submit(client, tokens.user_a, gpus=2)
    too_wide = client.get(f"/v1/jobs/{wide}/prediction", headers=bearer(tokens.user_a)).json()
    assert too_wide["cause"] == "unschedulable", too_wide
    waiting = client.get(f"/v1/jobs/{job}/prediction", headers=bearer(tokens.user_a)).json()
    assert waiting["cause"] == "no_plan", waiting

    queue = client.get("/v1/queue", headers=bearer(tokens.user_a)).json()
    assert {entry["job_id"]: entry["cause"] for entry in queue} == {
        job: "no_plan",
        wide: "unschedulable",
    }
    assert client.get("/v1/queue", headers=bearer(tokens.user_b)).json() == []


def test_the_stream_is_scoped_by_tenant_and_resumes_after_the_last_id(
    client: TestClient, tokens: Tokens
) -> None:
    mine = submit(client, tokens.user_a)
    theirs = submit(client, tokens.user_b)
    everything = events_of(client, tokens.user_a, since=0)
    assert {e["job_id"] for e in everything} == {mine}
    assert [(e["kind"], e["to"], e["reason"]) for e in everything] == [
        ("state", "PENDING", "submitted")
    ]
    cancelled = client.post(f"/v1/jobs/{mine}/cancel", headers=bearer(tokens.user_a))
    assert cancelled.status_code == 200
    after = events_of(client, tokens.user_a, last_event_id=everything[-1]["id"])
    assert [(e["from"], e["to"], e["state"]) for e in after] == [
        ("PENDING", "CANCELLED", "CANCELLED")
    ]
    assert events_of(client, tokens.user_a) == [], "no history without since or Last-Event-ID"
    admin = events_of(client, tokens.admin, since=0, job_id=theirs)
    assert {e["job_id"] for e in admin} == {theirs}
    hidden = client.get(
        "/v1/events", params={"job_id": theirs, "follow": "false"}, headers=bearer(tokens.user_a)
    )
    assert hidden.status_code == 404


def test_a_preemption_carries_its_reason_to_the_events_the_stream_and_the_rounds(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent, gpus=1)
    first, second = submit(client, tokens.user_a), submit(client, tokens.user_a)
    store_plan(database, [[first], [second]])
    with driver_on(database) as (driver, _):
        t0 = now()
        driver.step(t0)
        (attempt,) = (le.id for le in leases(database))
        report(client, tokens.agent, attempt, "started")
        driver.step(t0 + ROUND_S)
    report(client, tokens.agent, attempt, "checkpointed")

    events = client.get(
        f"/v1/jobs/{first}/events", params={"kind": "preemption"}, headers=bearer(tokens.user_a)
    ).json()["items"]
    (preemption,) = events
    assert preemption["reason"].startswith("preempted in round 1: not in round 1 (plan")
    assert preemption["payload"]["nodes"] == [NODE]
    suspended = [e for e in events_of(client, tokens.user_a, since=0) if e["to"] == "SUSPENDED"]
    assert "preempted in round 1" in suspended[0]["reason"], suspended

    rounds = client.get("/v1/rounds", headers=bearer(tokens.user_a)).json()
    assert [r["index"] for r in rounds["recent"]] == [0, 1]
    held = {(r["index"], h["job_id"], h["state"]) for r in rounds["recent"] for h in r["held"]}
    assert (0, first, "CHECKPOINTED") in held and (1, second, "ISSUED") in held
    assert (
        client.get("/v1/rounds", headers=bearer(tokens.user_b)).json()["recent"][1]["held"][0][
            "job_id"
        ]
        is None
    ), "another tenant's job is a GPU taken, without its id"

    attempts = client.get(f"/v1/jobs/{first}/attempts", headers=bearer(tokens.user_a)).json()
    assert attempts[0]["reason"].startswith("preempted in round 1"), attempts


def test_agents_ship_output_tails_that_the_job_shows(
    client: TestClient, tokens: Tokens, database: Database
) -> None:
    register(client, tokens.agent)
    job = submit(client, tokens.user_a, env={"MODE": "fast"})
    with driver_on(database) as (driver, _):
        driver.step(now())
    (lease,) = leases(database)
    polled = client.post(
        "/v1/agent/poll",
        json={"running": [lease.id], "logs": {lease.id: "epoch 1\nepoch 2\n", "other": "x"}},
        headers=bearer(tokens.agent),
    )
    assert polled.status_code == 200, polled.text
    (given,) = polled.json()["leases"]
    assert given["env"]["MODE"] == "fast" and given["env"]["SHOCKWAVE_JOB_ID"] == job
    attempts = client.get(f"/v1/jobs/{job}/attempts", headers=bearer(tokens.user_a)).json()
    assert [(a["attempt_id"], a["log_tail"]) for a in attempts] == [
        (lease.id, "epoch 1\nepoch 2\n")
    ]
    too_long = client.post(
        "/v1/agent/poll", json={"logs": {lease.id: "x" * 8193}}, headers=bearer(tokens.agent)
    )
    assert too_long.status_code == 422
    other = client.get(f"/v1/jobs/{job}/attempts", headers=bearer(tokens.user_b))
    assert other.status_code == 404
