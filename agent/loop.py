"""The agent loop: supervise the local attempts, then (when due) talk to the server.

Each :meth:`Agent.step`:

1. **Supervise** (every tick, with or without the server): an attempt whose process ended is
   reported (``checkpointed`` if it exited 0 after the agent asked it to stop, else ``exited``
   with its code); one asked to stop that outlives the grace period is killed; one whose lease
   ran out (``ends_at``, plus a little slack) without word of an extension is asked to stop.
2. **Contact** (every poll interval; after failures, after the backoff's delay): register if
   needed, then one ``POST /v1/agent/poll``: the reports owed, a heartbeat when due, what runs
   here (the server answers what must stop) and the job tokens of new leases. Reconcile: stop
   what is no longer leased or is listed in ``stop``, extend what the next round keeps (same
   attempt id, new ``ends_at``), start what is new; a second poll at once acknowledges what
   started (and delivers reports owed).
3. **Persist** the state file when anything changed.

Only the server's answers stop a job early; errors never do. While the server is unreachable
the jobs run on to the end of their leases, then stop cleanly, and the reports wait in the
state file until it answers again.

While it runs, the agent keeps its sign of life fresh (:mod:`agent.liveness`); each job's
wrapper stops the job once the agent has been gone for the orphan grace period. A job the agent
(or its wrapper) asked to stop is reported ``checkpointed`` when it exits 0, else ``exited``
with ``stop_requested``: a stop that ends in a signal or a nonzero code is still the stop that
was asked for, and the server puts the job back in the queue rather than failing it.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from agent.client import (
    AgentApi,
    ApiRefused,
    ApiUnavailable,
    Lease,
    LeasePoll,
    Report,
    Wait,
)
from agent.config import AgentConfig, RuntimeKind, safe_name
from agent.isolation import (
    PASSAGE,
    PoolExhausted,
    UidPool,
    can_switch_users,
    hand_over,
    private_dir,
    reap,
    secure_dir,
)
from agent.liveness import Beacon
from agent.runtime import JOB_ENV_FILE, Ended, Handle, Launch, Runtime
from agent.state import (
    FINISHED_KEEP_S,
    AgentState,
    AttemptRecord,
    load,
    save,
)
from agent.wrap import Watch
from shockwave.domain.backoff import Backoff
from shockwave.domain.lifecycle import reports_per_poll

log = logging.getLogger(__name__)

BUSY = 503
"""A poll's answer to a report on a job the server could not lock at once (``defer_busy``):
nothing was applied; the report stays owed."""
TICK_S = 0.2
NOT_RUN = 127
"""The exit code reported for a lease the agent could not start (no command, launch error)."""


class Agent:
    """One node's agent. ``clock`` is wall time (leases end at wall-clock times)."""

    def __init__(
        self,
        config: AgentConfig,
        client: AgentApi,
        runtimes: dict[RuntimeKind, Runtime],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.client = client
        self.runtimes = runtimes
        self.clock = clock
        self.state: AgentState = load(config.state_file)
        self.backoff = Backoff(base_s=0.5, cap_s=config.max_backoff_s)
        self.booted_at = clock()
        self.registered = False
        self.next_contact = 0.0
        self.next_heartbeat = 0.0
        self.unreachable_since: float | None = None
        self.dirty = False
        self.round: tuple[int, float | None] | None = None
        """The round the last poll answer named and when it ends (None: not known)."""
        self.beacon = Beacon(config.alive_file)
        self.final_logs: dict[str, str] = {}
        """The output tails of attempts that ended, owed to the server (not persisted: a
        restarted agent loses them, and the job's log shows the tail of its last heartbeat)."""
        self.uids: UidPool | None = None
        if config.job_uids is not None and can_switch_users():
            self.uids = UidPool(*config.job_uids, lock_dir=config.uid_lock_dir)

    # --- running -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Re-attach, then step until ``stop`` is set; then stop every job and deliver the
        reports (:meth:`drain`). The sign of life is kept fresh throughout."""
        self.beacon.start()
        try:
            self.reattach()
            while not stop.is_set():
                self.step()
                stop.wait(min(TICK_S, self.config.poll_interval_s))
            self.drain()
        finally:
            self.beacon.stop()

    def step(self) -> None:
        now = self.clock()
        self.supervise(now)
        if now >= self.next_contact:
            self.contact(now)
        self.persist()

    def reattach(self) -> None:
        """Find the processes of the attempts in the state file: the live ones are supervised
        again, the ended ones reported, the ones that never started forgotten (their lease,
        if still live, starts them anew). Their uids are the pool's again."""
        self.prepare_work_dir()
        for record in list(self.state.attempts.values()):
            uid = record.handle.uid
            if self.uids is not None and uid is not None and not self.uids.claim(uid):
                log.warning("uid %d of attempt %s is held by another agent", uid, record.attempt_id)
            runtime = self.runtimes[record.handle.kind]
            record.handle = runtime.recover(record.handle)
            ended = runtime.poll(record.handle)
            if ended is None:
                log.info(
                    "re-attached to attempt %s of job %s (pid %s)",
                    record.attempt_id,
                    record.job_id,
                    record.handle.pid or record.handle.container,
                )
            elif ended.code is None and (record.handle.pid == 0 or record.handle.container):
                log.warning("attempt %s never started: forgetting it", record.attempt_id)
                del self.state.attempts[record.attempt_id]
                self.clean_up(record)
            else:
                self.finish(record, ended, self.clock())
        self.dirty = True
        self.persist()

    def prepare_work_dir(self) -> None:
        """The work directory's folders: the agent's own (``attempts``, mode 0700: logs, exit
        statuses, environment files), and those jobs pass through to their own directories
        below (the work directory, ``checkpoints`` and ``scratch``, mode 0711: no job can
        list them)."""
        root = self.config.work_dir
        folders = [(root, PASSAGE), (root / "attempts", 0o700), (root / "scratch", PASSAGE)]
        if not (root / "checkpoints").is_symlink():  # shared storage, set up by its operator
            folders.append((root / "checkpoints", PASSAGE))
        for folder, mode in folders:
            try:
                secure_dir(folder, mode)
            except OSError as error:
                log.error("the work directory is not the agent's to close: %s", error)

    def drain(self, extra_s: float = 5.0) -> None:
        """Stop every job (SIGTERM, grace, SIGKILL) and try to deliver the reports, for at
        most the grace period plus ``extra_s``; what is not delivered stays in the state file."""
        now = self.clock()
        for record in self.state.attempts.values():
            self.request_stop(record, now, "the agent is stopping")
        deadline = now + self.config.grace_s + extra_s
        while self.clock() < deadline and (self.state.attempts or self.state.outbox):
            now = self.clock()
            self.supervise(now)
            if self.state.outbox and now >= self.next_contact:
                self.guarded(now, self.flush_outbox)
            self.persist()
            time.sleep(TICK_S)
        self.persist()

    # --- supervising ---------------------------------------------------------------------

    def supervise(self, now: float) -> None:
        self.beacon.touch()
        for record in list(self.state.attempts.values()):
            runtime = self.runtimes[record.handle.kind]
            ended = runtime.poll(record.handle)
            if ended is not None:
                self.finish(record, ended, now)
            elif record.stop_requested_at is not None:
                if not record.killed and now >= record.stop_requested_at + self.config.grace_s:
                    log.warning("attempt %s outlived the grace period: SIGKILL", record.attempt_id)
                    runtime.kill(record.handle)
                    record.killed = True
                    self.dirty = True
            elif now > max(record.ends_at, self.booted_at) + self.config.lease_slack_s:
                self.request_stop(record, now, "its lease ended with no word of an extension")

    def request_stop(self, record: AttemptRecord, now: float, reason: str) -> None:
        if record.stopping:
            return
        log.info("stopping attempt %s of job %s: %s", record.attempt_id, record.job_id, reason)
        record.stop_requested_at = now
        record.stop_reason = reason
        self.runtimes[record.handle.kind].terminate(record.handle)
        self.dirty = True

    def finish(self, record: AttemptRecord, ended: Ended, now: float) -> None:
        """Record the end of ``record`` and queue its report: asked to stop (by the agent, or
        by the wrapper with the agent gone), exit 0 is a checkpoint and any other end is the
        stop that was asked for; else the exit code is the job's own end."""
        code = ended.code
        if code is None:
            code = -int(signal.SIGKILL)
            log.warning("attempt %s ended with no recorded status", record.attempt_id)
        asked = record.stopping or ended.stop_requested
        if ended.stop_requested:
            log.warning("attempt %s was stopped by its wrapper: no agent", record.attempt_id)
        if asked and code == 0:
            report = Report(record.attempt_id, "checkpointed")
        else:
            report = Report(record.attempt_id, "exited", code, stop_requested=asked)
        outcome = "checkpointed" if report.state == "checkpointed" else f"exited {code}"
        log.info("attempt %s of job %s ended: %s", record.attempt_id, record.job_id, outcome)
        self.state.outbox.append(report)
        tail = log_tail(Path(record.handle.log_file))
        if tail is not None:
            self.final_logs[record.attempt_id] = tail
        del self.state.attempts[record.attempt_id]
        self.clean_up(record)
        self.state.finished[record.attempt_id] = now
        self.state.forget_finished_before(now - FINISHED_KEEP_S)
        self.dirty = True

    def clean_up(self, record: AttemptRecord) -> None:
        """An attempt that is over: every process left running as its uid killed (a uid this
        agent holds), the uid back in the pool, its working directory and any environment file
        its wrapper did not read removed."""
        uid = record.handle.uid
        if self.uids is not None and uid is not None and self.uids.holds(uid):
            left = reap(uid)
            if left:
                log.warning(
                    "killed %d process(es) attempt %s left running", left, record.attempt_id
                )
            self.uids.release(uid)
        shutil.rmtree(self.config.scratch_dir(record.attempt_id), ignore_errors=True)
        Path(record.handle.status_file).with_name(JOB_ENV_FILE).unlink(missing_ok=True)

    # --- talking to the server -----------------------------------------------------------

    def contact(self, now: float) -> None:
        self.guarded(now, lambda: self.exchange(now))

    def guarded(self, now: float, exchange: Callable[[], None]) -> None:
        """Run ``exchange``; on success the next contact is one poll interval away, on
        failure the backoff's delay away. Failures never stop a job."""
        try:
            exchange()
        except ApiUnavailable as error:
            self.unreachable(now, str(error))
            return
        except ApiRefused as error:
            if error.status == 404 and self.registered:
                log.warning("the server does not know this node (%s): registering again", error)
                self.registered = False
                self.next_contact = now
                return
            self.unreachable(now, f"refused: {error}")
            return
        if self.unreachable_since is not None:
            log.info("the server answers again after %.1f s", now - self.unreachable_since)
            self.unreachable_since = None
        self.backoff.reset()
        self.next_contact = now + self.config.poll_interval_s
        ends = None if self.round is None else self.round[1]
        if self.config.boundary_wait_s > 0 and ends is not None and now < ends:
            # the round ends before the next contact: poll then, for the next one
            self.next_contact = min(self.next_contact, ends)

    def unreachable(self, now: float, why: str) -> None:
        delay = self.backoff.failure()
        if self.unreachable_since is None:
            self.unreachable_since = now
            log.warning("cannot reach the server (%s); jobs keep their leases", why)
        else:
            log.debug("still cannot reach the server (%s); next try in %.1f s", why, delay)
        self.next_contact = now + delay

    def exchange(self, now: float) -> None:
        """Register if needed, then one poll: the reports owed, a heartbeat when due, what runs
        here (the server answers what must stop; a new attempt listed there is acknowledged as
        started), and a job token for each new lease. Reconcile; if that started something or
        left reports owed, a second poll at once says so."""
        if not self.registered:
            node = self.client.register(self.config.machine, self.config.hostname)
            log.info("registered node %s: %s GPUs (%s)", node["id"], node["gpus"], node["gpu_type"])
            self.registered = True
            self.next_heartbeat = now + self.config.heartbeat_interval_s
        beat = now >= self.next_heartbeat
        poll = self.poll(heartbeat=beat, tokens=True, wait=self.boundary_wait(now))
        if poll.current_round is not None:
            self.round = (poll.current_round, poll.round_ends_at)
        if beat:
            self.next_heartbeat = now + self.config.heartbeat_interval_s
        if self.reconcile(poll, now) or self.state.outbox:
            self.poll(heartbeat=False, tokens=False)

    def boundary_wait(self, now: float) -> Wait | None:
        """A long poll for the next round when the one the agent last saw has just ended
        (within twice ``boundary_wait_s`` of its end: a driver that is much later gets plain
        polls); None otherwise. Held at most half the request timeout."""
        wait_s = min(self.config.boundary_wait_s, self.config.request_timeout_s / 2)
        if self.round is None or wait_s <= 0:
            return None
        seen, ends = self.round
        if ends is None or not ends <= now < ends + 2 * wait_s:
            return None
        return Wait(wait_s, seen)

    def flush_outbox(self) -> None:
        """Deliver the reports owed (a poll without heartbeat; its leases are left for the
        next contact)."""
        self.poll(heartbeat=False, tokens=False)

    def poll(self, heartbeat: bool, tokens: bool, wait: Wait | None = None) -> LeasePoll:
        """``POST /v1/agent/poll`` with the reports owed and the attempts running here (held
        by the server while nothing is new, with ``wait``). The reports it answers leave the
        outbox, but for those answered 503 (their job was busy: sent again first in the next
        poll); one answered ``stop`` stops its attempt (a 404, an attempt the server does not
        know, is dropped, as is any refusal). At most ``reports_per_poll`` of the node's GPUs
        reports and log tails go in one poll (the server refuses more): the oldest first, the
        rest in the next polls."""
        most = reports_per_poll(self.config.machine.gpus)
        sent = self.state.outbox[:most]
        logs = dict(list(self.final_logs.items())[:most])
        if heartbeat:
            for running in self.state.attempts.values():
                tail = log_tail(Path(running.handle.log_file))
                if tail is not None and len(logs) < most:
                    logs[running.attempt_id] = tail
        poll = self.client.poll(sorted(self.state.attempts), sent, heartbeat, tokens, logs, wait)
        for attempt in logs:
            self.final_logs.pop(attempt, None)
        del self.state.outbox[: len(sent)]
        if sent:
            self.dirty = True
        # answered 503 (their job was busy, nothing applied): owed still, first, in order
        self.state.outbox[:0] = [
            report
            for report, answer in zip(sent, poll.reports, strict=True)
            if answer.get("status") == BUSY
        ]
        for report, answer in zip(sent, poll.reports, strict=True):
            if answer.get("status") == BUSY:
                continue
            if answer.get("status") not in (200, 404, 409):
                log.error("report %s refused: %s", report, answer)
            record = self.state.attempts.get(report.attempt_id)
            if answer.get("stop") is True and record is not None:
                self.request_stop(record, self.clock(), "the server says it must stop")
        return poll

    def reconcile(self, poll: LeasePoll, now: float) -> bool:
        """Stop what must stop, note extensions, start what is new; whether it started any."""
        for record in list(self.state.attempts.values()):
            if record.stopping:
                continue
            lease = poll.leases.get(record.attempt_id)
            if record.attempt_id in poll.stop:
                self.request_stop(record, now, "the server says it must stop")
            elif lease is None:
                self.request_stop(record, now, "it is no longer leased")
            elif lease.ends_at != record.ends_at:
                record.ends_at = lease.ends_at
                self.dirty = True
        started = False
        for lease in poll.leases.values():
            known = lease.attempt_id in self.state.attempts or lease.attempt_id in poll.stop
            if known or lease.attempt_id in self.state.finished or self.blocked(lease):
                continue
            started |= self.launch(lease, now, poll.tokens.get(lease.attempt_id))
        return started

    def blocked(self, lease: Lease) -> bool:
        """Whether a local attempt still holds the lease's job or one of its GPUs (it is
        stopping): the lease starts once that one has ended."""
        return any(
            record.job_id == lease.job_id or set(record.gpus) & set(lease.gpus)
            for record in self.state.attempts.values()
        )

    # --- starting ------------------------------------------------------------------------

    def launch(self, lease: Lease, now: float, token: str | None) -> bool:
        """Start ``lease``'s job with ``token`` (None: ask for one); whether it started. The
        record is saved before the process starts, so an agent killed at any point finds it
        again (:meth:`reattach`)."""
        token = token or self.job_token(lease)
        if token is None:
            return False
        if not lease.command:
            self.not_run(lease, now, "its job has no command")
            return False
        try:
            uid = self.uids.take() if self.uids is not None else None
        except PoolExhausted as error:
            self.not_run(lease, now, str(error))
            return False
        checkpoint = self.checkpoint_dir(lease)
        folder = self.config.attempt_dir(lease.attempt_id)
        scratch = self.config.scratch_dir(lease.attempt_id)
        try:
            secure_dir(folder)
            private_dir(scratch, uid)
            if uid is not None:
                hand_over(checkpoint, uid)
            else:
                private_dir(checkpoint, None)
        except OSError as error:
            if uid is not None and self.uids is not None:
                self.uids.release(uid)
            self.not_run(lease, now, f"its directories could not be made private: {error}")
            return False
        launch = Launch(
            attempt_id=lease.attempt_id,
            argv=lease.command,
            image=lease.image,
            env=self.job_env(lease, token, checkpoint),
            gpus=lease.gpus,
            log_file=folder / "output.log",
            pid_file=folder / "wrapper.json",
            status_file=folder / "exit-status.json",
            checkpoint_dir=checkpoint,
            watch=self.watch(),
            uid=uid,
            scratch_dir=scratch,
        )
        docker = self.config.runtime == "docker" and lease.image is not None
        kind: RuntimeKind = "docker" if docker else "process"
        record = AttemptRecord(
            attempt_id=lease.attempt_id,
            job_id=lease.job_id,
            gpus=list(lease.gpus),
            ends_at=lease.ends_at,
            handle=Handle.planned(kind, launch),
            started_at=now,
        )
        self.state.attempts[lease.attempt_id] = record
        save(self.config.state_file, self.state)
        try:
            record.handle = self.runtimes[kind].start(launch)
        except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as error:
            del self.state.attempts[lease.attempt_id]
            self.clean_up(record)
            self.not_run(lease, now, f"it could not start: {error}")
            return False
        log.info(
            "started attempt %s of job %s on GPUs %s (%s %s)",
            lease.attempt_id,
            lease.job_id,
            ",".join(str(g) for g in lease.gpus),
            kind,
            record.handle.pid or record.handle.container,
        )
        self.dirty = True
        self.persist()
        return True

    def watch(self) -> Watch | None:
        """What each job's wrapper watches to stop the job once this agent is gone."""
        if self.config.orphan_grace_s <= 0:
            return None
        return Watch(self.config.alive_file, self.config.orphan_grace_s, self.config.grace_s)

    def job_token(self, lease: Lease) -> str | None:
        try:
            return self.client.job_token(lease.attempt_id)
        except ApiRefused as refused:
            log.info("no token for attempt %s (%s): not starting it", lease.attempt_id, refused)
            return None

    def not_run(self, lease: Lease, now: float, why: str) -> None:
        log.error("cannot run attempt %s of job %s: %s", lease.attempt_id, lease.job_id, why)
        self.state.outbox.append(Report(lease.attempt_id, "exited", NOT_RUN))
        self.state.finished[lease.attempt_id] = now
        self.dirty = True

    def checkpoint_dir(self, lease: Lease) -> Path:
        """The job's checkpoint directory: the lease's, one folder directly in the work
        directory's ``checkpoints`` (the same for every attempt of the job; ``checkpoints``
        may be a link to shared storage); any other path is not used (the directory is handed
        to the job's uid, and nothing else of the agent's may be)."""
        base = self.config.work_dir.resolve() / "checkpoints"
        wanted = (self.config.work_dir.resolve() / lease.checkpoint_dir).resolve()
        if wanted.parent == base.resolve() and not Path(lease.checkpoint_dir).is_absolute():
            return wanted
        return base.resolve() / safe_name(lease.job_id)

    def job_env(self, lease: Lease, token: str, checkpoint: Path) -> dict[str, str]:
        """What the job's environment adds: the lease's ``env`` and what only
        the agent knows (the API's URL, the job's token, the absolute checkpoint directory)."""
        env = {"PYTHONUNBUFFERED": "1", **lease.env}
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in lease.gpus),
                "SHOCKWAVE_JOB_ID": lease.job_id,
                "SHOCKWAVE_ATTEMPT_ID": lease.attempt_id,
                "SHOCKWAVE_BATCH_SIZE": str(lease.batch_size),
                "SHOCKWAVE_WORLD_SIZE": str(len(lease.gpus)),
                "SHOCKWAVE_API_URL": self.config.api_url,
                "SHOCKWAVE_TOKEN": token,
                "SHOCKWAVE_CHECKPOINT_DIR": str(checkpoint),
                "SHOCKWAVE_ROUND_ENDS_AT": datetime.fromtimestamp(lease.ends_at, UTC).isoformat(),
            }
        )
        return env

    def persist(self) -> None:
        if self.dirty:
            save(self.config.state_file, self.state)
            self.dirty = False


LOG_TAIL_BYTES = 8000
"""How much of an attempt's output the agent ships with its polls (the server keeps 8192
characters at most; bytes that are not UTF-8 become U+FFFD, which may take 3 bytes each, so
the tail is cut to characters again)."""


def log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str | None:
    """The last ``limit`` bytes of ``path`` as text (no NUL), or None if it cannot be read."""
    try:
        with path.open("rb") as file:
            file.seek(0, 2)
            size = file.tell()
            file.seek(max(0, size - limit))
            data = file.read(limit)
    except OSError:
        return None
    return data.decode("utf-8", errors="replace").replace("\x00", "")[-limit:]
