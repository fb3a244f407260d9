"""Two tenants' jobs side by side on one agent, in each runtime, each trying to reach the other.

A real ``shockwave up`` (SQLite), one agent of two slots run as root with its token in its
environment (``SHOCKWAVE_AGENT_TOKEN``, where a job of the agent's own user could read it from
``/proc/<agent pid>/environ``), and two tenants who each submit a job carrying a secret in its
``env``. Each job is :data:`PROBE`: it writes its secret to its checkpoint directory, says it is
ready, and once both are running (the test hands each, in its own checkpoint directory, the
other's paths; neither exits before the test has both results) it tries to read every other
process's environment, and to read and write the other job's checkpoint directory and files,
its log and working directory, the agent's state file and the agent's token file. What it
could reach it writes to ``result.json``.

- As processes (the uid pool): each job runs as a uid of its own, and reaches nothing of the
  other's nor the agent's token; it does see the other's process (so they ran together).
- As containers (the real Docker engine, the project's image, ``--container-network none``):
  the same, and the ``docker run`` options the job appends to its command (``--user=0:0``,
  ``--volume=/:/host``, ``--privileged``) are its program's arguments, never Docker's: it runs
  as its uid, with no capability, a read-only root and no ``/host``.
- An ``image`` that tries to be an option (``--volume=/:/host:ro``) is refused at submission:
  a 422 problem naming ``image``, nothing stored.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent.config import safe_name
from bench.deployment import ROOT
from shockwave_cli.runtime.supervision import Supervised, free_port, shockwave_argv, wait_until
from tests.e2e.engine import containers, remove
from tests.integration.test_agent_process import clean_env, create_token
from tests.job_python import job_python

NODE = "iso-1"
TENANTS = ("acme", "globex")
HOSTILE_ARGS = ("--user=0:0", "--volume=/:/host", "--privileged", "--network=host")
"""``docker run`` options a job appends to its command: arguments of its program, no more."""

PROBE = r"""
import json, os, sys, time
ckpt = os.environ["SHOCKWAVE_CHECKPOINT_DIR"]
own_token = os.environ["SHOCKWAVE_TOKEN"]
with open(os.path.join(ckpt, "secret.txt"), "w") as f:
    f.write(os.environ["TENANT_SECRET"])
open(os.path.join(ckpt, "ready"), "w").close()
targets_file = os.path.join(ckpt, "targets.json")
deadline = time.time() + 120
while not os.path.exists(targets_file) and time.time() < deadline:
    time.sleep(0.2)
targets = json.load(open(targets_file))
def attempt(action):
    try:
        action()
        return "ok"
    except Exception as error:
        return type(error).__name__
def read(path):
    if os.path.isdir(path):
        os.listdir(path)
    else:
        open(path, "rb").read()
def write(path):
    where = os.path.join(path, "pwned") if os.path.isdir(path) else path
    with open(where, "a") as f:
        f.write("pwned")
paths = {p: {"read": attempt(lambda: read(p)), "write": attempt(lambda: write(p))}
         for p in targets["paths"]}
environs, seen_other = {}, False
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        seen_other = seen_other or (targets["marker"].encode() in cmdline)
    except OSError:
        pass
    try:
        environs[pid] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
    except OSError as error:
        pass
status = open("/proc/self/status").read()
capabilities = [l.split()[1] for l in status.splitlines() if l.startswith("CapEff:")][0]
result = {
    "token": own_token, "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "argv": sys.argv[1:], "paths": paths, "environs": environs, "seen_other": seen_other,
    "own_environ": attempt(lambda: open("/proc/self/environ").read()),
    "cap_eff": capabilities, "host_mounted": os.path.exists("/host/etc"),
    "root_writable": attempt(lambda: open("/usr/pwned", "w").close()),
}
with open(os.path.join(ckpt, "result.json.tmp"), "w") as f:
    json.dump(result, f)
os.rename(os.path.join(ckpt, "result.json.tmp"), os.path.join(ckpt, "result.json"))
deadline = time.time() + 60  # alive until both have looked (the test releases them)
while not os.path.exists(os.path.join(ckpt, "release")) and time.time() < deadline:
    time.sleep(0.2)
print("probe done", flush=True)
"""


@dataclass
class Service:
    tmp: Path
    base: str
    admin: str
    agent_token: str
    users: dict[str, str]
    work_dir: Path

    def call(self, method: str, path: str, token: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.request(method, f"{self.base}{path}", headers=headers, timeout=5, **kwargs)

    def submit(self, tenant: str, body: dict[str, Any]) -> httpx.Response:
        return self.call("POST", "/v1/jobs", self.users[tenant], json=body)

    def state(self, job_id: str) -> str:
        response = self.call("GET", f"/v1/jobs/{job_id}", self.admin)
        assert response.status_code == 200, response.text
        state: str = response.json()["state"]
        return state

    def attempts(self, job_id: str) -> list[str]:
        uri = f"file:{self.tmp / 'shockwave.db'}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True)) as connection:
            rows = connection.execute(
                "SELECT id FROM leases WHERE job_id = ? ORDER BY issued_at", (job_id,)
            ).fetchall()
        return [str(row[0]) for row in rows]


@contextmanager
def service(tmp_path: Path, jobs_dir: Path, runtime: str) -> Iterator[Service]:
    database = tmp_path / "shockwave.db"
    admin = create_token(database, "admin")
    agent_token = create_token(database, "agent", "--node", NODE, "--gpus", "2")
    users = {t: create_token(database, "user", "--tenant", t) for t in TENANTS}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    up = Supervised(
        cwd=ROOT,
        name="up",
        argv=[
            *shockwave_argv(),
            *("up", "--no-open", "--port", str(port), "--db", str(database)),
            *("--round-seconds", "5", "--policy", "fifo", "--log-level", "warning"),
        ],
        env=clean_env(),
        log_path=tmp_path / "up.log",
    )
    work = jobs_dir / "work"
    agent = Supervised(
        cwd=ROOT,
        name="agent",
        argv=[
            *shockwave_argv(),
            *("agent", "--api", base, "--gpus", "2", "--runtime", runtime),
            *("--work-dir", str(work), "--poll-interval", "0.5", "--heartbeat-interval", "1"),
            *("--job-uids", "62000-62009", "--container-network", "none"),
        ],
        env={**clean_env(), "SHOCKWAVE_AGENT_TOKEN": agent_token},
        log_path=tmp_path / "agent.log",
    )
    try:
        up.start()
        wait_until(lambda: "Shockwave is up" in up.log_tail(), 60, lambda: up.log_tail())
        agent.start()
        yield Service(tmp_path, base, admin, agent_token, users, work)
    finally:
        agent.stop()
        up.stop()
        print(f"--- agent\n{(tmp_path / 'agent.log').read_text(errors='replace')[-6000:]}")
        if runtime == "docker" and database.exists():
            with closing(sqlite3.connect(database)) as connection:
                leases = [str(r[0]) for r in connection.execute("SELECT id FROM leases")]
            names = {f"shockwave-{safe_name(attempt)}" for attempt in leases}
            left = containers(names)
            remove(names)
            assert not left, f"containers left behind: {left}"


def probe_job(name: str, secret: str, program: list[str], image: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "gpus": 1,
        "epochs": 1000,
        "samples_per_epoch": 1000,
        "initial_batch_size": 32,
        "command": [*program, "-c", PROBE, f"marker-{name}", *HOSTILE_ARGS],
        "env": {"TENANT_SECRET": secret},
    }
    if image is not None:
        body["image"] = image
    return body


def two_tenants(run: Service, program: list[str], image: str | None) -> None:
    """Both tenants' probes run side by side; neither reaches the other nor the agent."""
    secrets = {t: f"secret-of-{t}-{os.urandom(6).hex()}" for t in TENANTS}
    jobs = {}
    for tenant in TENANTS:
        response = run.submit(tenant, probe_job(f"probe-{tenant}", secrets[tenant], program, image))
        assert response.status_code == 201, response.text
        jobs[tenant] = response.json()["id"]
    checkpoints = {t: run.work_dir / "checkpoints" / jobs[t] for t in TENANTS}
    wait_until(
        lambda: all((checkpoints[t] / "ready").exists() for t in TENANTS),
        120,
        lambda: f"both probes to start: {[run.state(j) for j in jobs.values()]}",
    )
    attempts = {t: run.attempts(jobs[t])[-1] for t in TENANTS}
    token_file = run.work_dir.parent / "agent.token"  # only its mode 0600 keeps jobs out
    token_file.write_text(run.agent_token)
    token_file.chmod(0o600)
    for tenant in TENANTS:
        other = TENANTS[1 - TENANTS.index(tenant)]
        paths = [
            str(checkpoints[other]),
            str(checkpoints[other] / "secret.txt"),
            str(run.work_dir / "attempts" / attempts[other]),
            str(run.work_dir / "attempts" / attempts[other] / "output.log"),
            str(run.work_dir / "scratch" / attempts[other]),
            str(run.work_dir / "agent-state.json"),
            str(token_file),
        ]
        if image is None:  # in a container, the folders above its own mount are its own
            paths.append(str(run.work_dir / "checkpoints"))
        targets = {"paths": paths, "marker": f"marker-probe-{other}"}
        (checkpoints[tenant] / "targets.json").write_text(json.dumps(targets))
    wait_until(
        lambda: all((checkpoints[t] / "result.json").exists() for t in TENANTS),
        60,
        lambda: f"both probes to finish: {[run.state(j) for j in jobs.values()]}",
    )
    results = {t: json.loads((checkpoints[t] / "result.json").read_text()) for t in TENANTS}
    for tenant in TENANTS:
        (checkpoints[tenant] / "release").touch()
    for tenant in TENANTS:
        other = TENANTS[1 - TENANTS.index(tenant)]
        found = results[tenant]
        said = json.dumps(found)
        print(f"{tenant}: uid {found['uid']}, {len(found['environs'])} environments readable")
        assert secrets[other] not in said, f"{tenant} read {other}'s secret"
        assert results[other]["token"] not in said, f"{tenant} read {other}'s job token"
        assert run.agent_token not in said, f"{tenant} read the agent's token"
        for path, outcome in found["paths"].items():
            assert "ok" not in outcome.values(), f"{tenant} reached {path}: {outcome}"
        assert found["own_environ"] == "ok", "the probe reads its own environment"
        assert found["uid"] != 0 and found["uid"] != results[other]["uid"]
        assert 62000 <= found["uid"] <= 62009 and found["gid"] == found["uid"]
        assert found["argv"][1:] == list(HOSTILE_ARGS), "the options are the program's arguments"
        assert (checkpoints[tenant] / "secret.txt").read_text() == secrets[tenant]
        assert not (checkpoints[tenant] / "pwned").exists()
    if image is None:
        assert all(results[t]["seen_other"] for t in TENANTS), "the two ran side by side"
    else:
        for tenant in TENANTS:
            found = results[tenant]
            assert int(found["cap_eff"], 16) == 0, "no capability"
            assert not found["host_mounted"], "nothing of the host's is mounted"
            assert found["root_writable"] != "ok", "the root file system is read-only"
            assert found["groups"] == [] or found["groups"] == [found["gid"]]
    wait_until(
        lambda: {run.state(j) for j in jobs.values()} == {"SUCCEEDED"},
        60,
        lambda: f"both probes to succeed: {[run.state(j) for j in jobs.values()]}",
    )


def test_two_tenants_processes_are_apart_on_one_agent(
    tmp_path: Path, passable_tmp_path: Path
) -> None:
    with service(tmp_path, passable_tmp_path, "process") as run:
        two_tenants(run, [job_python()], image=None)


def test_two_tenants_containers_are_apart_and_the_job_adds_no_docker_option(
    tmp_path: Path, passable_tmp_path: Path, project_image: str
) -> None:
    began = time.monotonic()
    with service(tmp_path, passable_tmp_path, "docker") as run:
        hostile = probe_job("image-as-option", "s", ["python3"], "--volume=/:/host:ro")
        refused = run.submit("acme", hostile)
        assert refused.status_code == 422, refused.text
        assert "image" in refused.text, refused.text
        listed = run.call("GET", "/v1/jobs", run.users["acme"]).json()
        assert listed["items"] == [], "a refused submission is not stored"
        two_tenants(run, ["python3"], image=project_image)
    print(f"{time.monotonic() - began:.0f} s")
