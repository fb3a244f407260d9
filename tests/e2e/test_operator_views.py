"""What operators and integrators use, against a real ``shockwave up`` with a real node agent:
the CLI commands (submit with a command, ls, get/why/logs by id prefix, nodes, cluster, the
event stream), the dashboard in headless Chromium, the OpenAPI document through a client
generated from it, and the embedded /metrics.

One ``shockwave up`` (1 s rounds) and one ``shockwave agent`` (2 GPU slots, process runtime)
serve the whole module; the jobs run ``sh -c 'echo ...; sleep ...'``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from bench.deployment import ROOT, base_env
from shockwave_cli.main import app
from shockwave_cli.runtime.supervision import Supervised, free_port, shockwave_argv, wait_until

NOWHERE_ENV = base_env("postgresql+psycopg://nobody@127.0.0.1:1/none", "redis://127.0.0.1:1/0")
runner = CliRunner()
SCREENSHOTS = os.environ.get("SHOCKWAVE_SCREENSHOTS")
"""A folder to keep the dashboard's screenshots in (docs/images when refreshing the docs)."""


@dataclass(frozen=True)
class Service:
    url: str
    database: Path
    up: Supervised
    agent: Supervised

    def user_token(self, tenant: str) -> str:
        """A user token of ``tenant``, made by ``shockwave admin create-token``."""
        made = subprocess.run(
            [*shockwave_argv(), "admin", "create-token", "--role", "user", "--tenant", tenant],
            env={**NOWHERE_ENV, "SHOCKWAVE_DATABASE_URL": f"sqlite:///{self.database}"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        return made.stdout.strip()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("operator")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    up = Supervised(
        cwd=ROOT,
        name="up",
        argv=[
            *shockwave_argv(),
            *("up", "--port", str(port), "--db", str(folder / "sw.db"), "--round-seconds", "1"),
        ],
        env=NOWHERE_ENV,
        log_path=folder / "up.log",
    ).start()
    agent = None
    try:
        wait_until(lambda: "Shockwave is up" in up.log_tail(), 30, lambda: f"up:\n{up.log_tail()}")
        agent = Supervised(
            cwd=ROOT,
            name="agent",
            argv=[
                *shockwave_argv(),
                *("agent", "--api", url, "--gpus", "2", "--runtime", "process"),
                *("--node-name", "n1", "--work-dir", str(folder / "agent")),
                *("--poll-interval", "0.2", "--heartbeat-interval", "0.5"),
            ],
            env=NOWHERE_ENV,
            log_path=folder / "agent.log",
        ).start()
        wait_until(
            lambda: _nodes(url) == ["READY"], 30, lambda: f"the agent's node:\n{agent.log_tail()}"
        )
        yield Service(url, folder / "sw.db", up, agent)
    finally:
        if agent is not None:
            agent.stop()
        up.stop()


def _nodes(url: str) -> list[str]:
    try:
        body = httpx.get(f"{url}/v1/nodes", timeout=5).json()
    except httpx.HTTPError:
        return []
    return [node["state"] for node in body.get("items", [])]


def cli(service: Service, *args: str) -> Result:
    return runner.invoke(app, [*args, "--api-url", service.url])


def submit(service: Service, name: str, script: str, *extra: str) -> str:
    result = cli(
        service,
        "jobs",
        "submit",
        "--name",
        name,
        "--gpus",
        "1",
        "--epochs",
        "1",
        "--samples-per-epoch",
        "10",
        "--batch-size",
        "1",
        "--command",
        f"sh -c '{script}'",
        *extra,
        "-o",
        "json",
    )
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    job_id: str = json.loads(result.stdout)["id"]
    return job_id


def state(service: Service, job_id: str) -> str:
    return str(httpx.get(f"{service.url}/v1/jobs/{job_id}", timeout=5).json()["state"])


@pytest.fixture(scope="module")
def finished_job(service: Service) -> str:
    """A job that printed two lines (one from --env) and succeeded."""
    job_id = submit(
        service,
        "hello",
        'echo hello-from-the-job; echo "greeting=$GREETING"',
        "--env",
        "GREETING=hi",
    )
    wait_until(lambda: state(service, job_id) == "SUCCEEDED", 30, f"job {job_id} to succeed")
    return job_id


def test_cli_commands_work_against_shockwave_up(service: Service, finished_job: str) -> None:
    prefix = finished_job[:6]

    no_command = cli(
        service,
        "jobs",
        "submit",
        *("--name", "wide", "--gpus", "8", "--epochs", "1", "--samples-per-epoch", "10"),
        *("--batch-size", "4"),
    )
    assert no_command.exit_code == 0, no_command.output
    assert "has no command: it is planned, but no node agent can run it" in no_command.stderr

    listed = cli(service, "jobs", "ls")
    assert listed.exit_code == 0, listed.output
    assert finished_job[:8] in listed.stdout and finished_job not in listed.stdout
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80, listed.stdout
    wide = cli(service, "jobs", "ls", "--wide")
    assert finished_job in wide.stdout

    got = cli(service, "jobs", "get", prefix, "-o", "json")
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout)["env"] == {"GREETING": "hi"}

    logs = cli(service, "jobs", "logs", prefix)
    assert logs.exit_code == 0, logs.output
    assert "hello-from-the-job" in logs.stdout and "greeting=hi" in logs.stdout
    followed = cli(service, "jobs", "logs", prefix, "-f", "--interval", "0.2")
    assert followed.exit_code == 0 and "hello-from-the-job" in followed.stdout

    why = cli(service, "jobs", "why", prefix)
    assert why.exit_code == 0, why.output
    assert "the job is SUCCEEDED" in why.stdout

    unschedulable = cli(service, "jobs", "ls", "--name", "wide", "-o", "json")
    eight = json.loads(unschedulable.stdout)["items"][0]["id"]
    why_eight = cli(service, "jobs", "why", eight[:8], "-o", "json")
    assert json.loads(why_eight.stdout)["cause"] == "unschedulable", why_eight.stdout
    assert cli(service, "jobs", "cancel", eight[:8]).exit_code == 0

    nothing = cli(service, "jobs", "get", "ffffffff")
    assert nothing.exit_code == 1 and "no job id starts with 'ffffffff'" in nothing.stderr

    nodes = cli(service, "nodes", "ls")
    assert nodes.exit_code == 0, nodes.output
    assert "n1" in nodes.stdout and "READY" in nodes.stdout

    cluster = cli(service, "cluster")
    assert cluster.exit_code == 0, cluster.output
    assert "2 READY of 2" in cluster.stdout

    events = cli(
        service, "jobs", "watch", "--events", "--since", "0", "--job", prefix, "--count", "3"
    )
    assert events.exit_code == 0, events.output
    assert "PENDING -> RUNNING" in " ".join(events.stdout.split()), events.stdout


def test_embedded_metrics_carry_the_drivers(service: Service, finished_job: str) -> None:
    text = httpx.get(f"{service.url}/metrics", timeout=5).text
    rounds = re.search(r"^shockwave_driver_current_round (\d+)", text, re.MULTILINE)
    assert rounds is not None and float(rounds.group(1)) >= 1, text[:2000]
    assert "shockwave_http_requests_total" in text


def test_no_page_references_another_host(service: Service) -> None:
    pages = ["/", "/docs", "/redoc", "/static/dashboard/dashboard.js"]
    for page in pages:
        body = httpx.get(f"{service.url}{page}", timeout=5).text
        hosts = set(re.findall(r"(?:https?:)?//([A-Za-z0-9.-]+\.[A-Za-z]{2,})", body))
        assert not hosts - {"www.w3.org"}, (page, hosts)
    assert "dashboard.js" in httpx.get(f"{service.url}/", timeout=5).text


def test_the_dashboard_renders_in_headless_chromium(
    service: Service, finished_job: str, tmp_path: Path
) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    running = submit(service, "long-runner", "echo started; sleep 30")
    wait_until(lambda: state(service, running) == "RUNNING", 30, "the second job to run")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP refusals land there
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    browser = webdriver.Chrome(options=options, service=DriverService(driver_path))
    shots = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    try:
        wait = WebDriverWait(browser, 20)
        browser.get(service.url + "/")
        row = f'tr.job-row[data-job="{running}"]'
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, row)))
        assert "RUNNING" in browser.find_element(By.CSS_SELECTOR, row).text
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "tr.node-row")))
        # the nodes panel shows the holders of the round it read; a page read while a boundary
        # was being written shows the next refresh's (every 5 s)
        wait.until(ready.text_to_be_present_in_element((By.CSS_SELECTOR, "#nodes"), "long-runner"))
        # `shockwave up` is in open mode: the page says so and offers no log-in or log-out.
        assert browser.find_element(By.ID, "open-mode").is_displayed()
        assert "Open mode" in browser.find_element(By.ID, "open-mode").text
        assert not browser.find_element(By.ID, "login").is_displayed()
        summary = browser.find_element(By.ID, "cluster-summary").text
        assert re.search(r"; round \d+ \(", summary), summary
        tenant = "tr.tenant-row"
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, tenant)))
        tenants_text = browser.find_element(By.CSS_SELECTOR, "#tenants").text
        assert "entitled GPUs" in tenants_text and len(tenants_text.splitlines()) >= 2
        held = browser.find_element(By.CSS_SELECTOR, "#nodes .gpu[data-color]")
        assert held.value_of_css_property("border-left-width") == "6px", "coloured via CSSOM"
        cell = f'#gantt-svg rect.cell[data-job="{running}"]'
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, cell)))
        browser.save_screenshot(str(shots / "dashboard-overview.png"))

        browser.find_element(By.CSS_SELECTOR, f'{row} a[href="#/jobs/{running}"]').click()
        wait.until(ready.text_to_be_present_in_element((By.ID, "job-title"), running))
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "#timeline-svg")))
        # What the job has not trained yet is a prediction: dashed, apart from what was observed.
        predicted = browser.find_elements(By.CSS_SELECTOR, "#timeline-svg line.regime.predicted")
        assert predicted, browser.find_element(By.ID, "job-timeline").get_attribute("innerHTML")
        assert all(line.get_attribute("stroke-dasharray") for line in predicted)
        observed = browser.find_elements(By.CSS_SELECTOR, "#timeline-svg line.regime.observed")
        assert not any(line.get_attribute("stroke-dasharray") for line in observed)
        wait.until(ready.text_to_be_present_in_element((By.ID, "job-log"), "started"))
        events = browser.find_element(By.ID, "job-events").text
        assert "PENDING → RUNNING" in events, events
        assert browser.find_elements(By.CSS_SELECTOR, "tr.attempt-row")
        browser.save_screenshot(str(shots / "dashboard-job.png"))
        browser.get(f"{service.url}/#/jobs/{finished_job}")
        wait.until(ready.text_to_be_present_in_element((By.ID, "job-why"), "SUCCEEDED"))
        assert browser.execute_script("return window.localStorage.length") == 0

        # The documentation pages work under their Content-Security-Policy.
        browser.get(f"{service.url}/docs")
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".swagger-ui .opblock")))
        browser.get(f"{service.url}/redoc")
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "[data-section-id]")))
        # Nothing of the pages themselves is refused; what the policy does refuse is what they
        # would fetch from another host (ReDoc's "powered by" logo from cdn.redoc.ly).
        logs: list[dict[str, Any]] = browser.get_log("browser")  # type: ignore[no-untyped-call]
        refused = [
            entry["message"]
            for entry in logs
            if "Content Security Policy" in entry["message"]
            and not re.search(r"Loading the image 'https://(?!127\.0\.0\.1)", entry["message"])
        ]
        assert not refused, refused
    finally:
        browser.quit()
        httpx.post(f"{service.url}/v1/jobs/{running}/cancel", timeout=5)


def test_a_generated_client_submits_lists_follows_and_cancels(
    service: Service, tmp_path: Path
) -> None:
    document = tmp_path / "openapi.json"
    document.write_text(httpx.get(f"{service.url}/openapi.json", timeout=5).text)
    config = tmp_path / "config.yaml"
    config.write_text("post_hooks: []\nproject_name_override: shockwave-client\n")
    generator = Path(sys.executable).parent / "openapi-python-client"
    made = subprocess.run(
        [
            *(str(generator), "generate", "--path", str(document), "--config", str(config)),
            *("--output-path", str(tmp_path / "client")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert "Warning" not in made.stdout, made.stdout
    sys.path.insert(0, str(tmp_path / "client"))
    try:
        _drive_generated_client(service)
    finally:
        sys.path.remove(str(tmp_path / "client"))
        for name in [m for m in sys.modules if m.startswith("shockwave_client")]:
            del sys.modules[name]


def _drive_generated_client(service: Service) -> None:
    from shockwave_client import AuthenticatedClient  # type: ignore[import-not-found]
    from shockwave_client.api.events import stream_events  # type: ignore[import-not-found]
    from shockwave_client.api.jobs import (  # type: ignore[import-not-found]
        cancel_job,
        get_job,
        get_job_prediction,
        list_jobs,
        submit_job,
    )
    from shockwave_client.models import (  # type: ignore[import-not-found]
        JobCreate,
        JobCreateGpus,
    )

    client = AuthenticatedClient(base_url=service.url, token=service.user_token("integrator"))
    body = JobCreate(
        name="generated",
        gpus=JobCreateGpus.VALUE_2,
        epochs=2,
        samples_per_epoch=100,
        initial_batch_size=8,
        command=["sh", "-c", "sleep 30"],
    )
    submitted = submit_job.sync_detailed(client=client, body=body)
    assert submitted.status_code == 201, submitted.content
    job: Any = submitted.parsed
    assert (job.name, job.gpus, job.tenant) == ("generated", 2, "integrator"), job
    listed: Any = list_jobs.sync(client=client, name="generated")
    assert [j.id for j in listed.items] == [job.id]
    wait_until(
        lambda: get_job.sync(client=client, job_id=job.id).state.value == "RUNNING",
        30,
        "the generated client's job to run",
    )
    why: Any = get_job_prediction.sync(client=client, job_id=job.id)
    assert why.cause.value == "running"
    cancelled: Any = cancel_job.sync(client=client, job_id=job.id)
    assert cancelled.state.value == "CANCELLED"
    stream = stream_events.sync_detailed(client=client, job_id=job.id, since=0, follow=False)
    assert stream.status_code == 200
    events = [
        json.loads(line[5:])
        for line in stream.content.decode().splitlines()
        if line.startswith("data:")
    ]
    # the round driver's revocation of the cancelled job's lease may already have followed
    changes = [event["to"] for event in events if event["kind"] == "state"]
    assert changes[0] == "PENDING" and changes[-1] == "CANCELLED", events
    assert {event["kind"] for event in events} <= {"state", "preemption"}, events
