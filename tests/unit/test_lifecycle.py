"""The state machines of the core: job moves, lease moves, and what an agent's report does."""

from __future__ import annotations

import itertools

import pytest

from shockwave.domain.lifecycle import (
    LEASE_ALLOWED,
    LIVE_LEASES,
    IllegalTransition,
    JobEffect,
    JobState,
    LeaseState,
    Report,
    ReportEffect,
    lease_transition,
    report_effect,
    transition,
)

L, J, R, E = LeaseState, JobState, Report, JobEffect


@pytest.mark.parametrize(
    ("lease", "exit_code", "job", "report", "reported_code", "stop_requested", "effect"),
    [
        (L.ISSUED, None, J.PENDING, R.STARTED, None, False, ReportEffect(L.STARTED, job=E.RUN)),
        (L.ISSUED, None, J.PENDING, R.RUNNING, None, False, ReportEffect(L.RUNNING, job=E.RUN)),
        (L.STARTED, None, J.RUNNING, R.STARTED, None, False, ReportEffect(job=E.RUN)),
        (L.RUNNING, None, J.RUNNING, R.RUNNING, None, False, ReportEffect(job=E.RUN)),
        (L.RUNNING, None, J.RUNNING, R.STARTED, None, False, ReportEffect(job=E.RUN)),
        (
            L.RUNNING,
            None,
            J.SUCCEEDED,
            R.RUNNING,
            None,
            False,
            ReportEffect(L.REVOKED, refused="job j is succeeded"),
        ),
        (
            L.REVOKED,
            None,
            J.RUNNING,
            R.RUNNING,
            None,
            False,
            ReportEffect(refused="attempt a was revoked"),
        ),
        (
            L.RUNNING,
            None,
            J.RUNNING,
            R.CHECKPOINTED,
            None,
            False,
            ReportEffect(L.CHECKPOINTED, job=E.REQUEUE),
        ),
        (L.REVOKED, None, J.CANCELLED, R.CHECKPOINTED, None, False, ReportEffect(L.CHECKPOINTED)),
        (L.RUNNING, None, J.RUNNING, R.EXITED, 0, False, ReportEffect(L.EXITED, 0, E.SUCCEED)),
        (L.RUNNING, None, J.RUNNING, R.EXITED, None, False, ReportEffect(L.EXITED, 0, E.SUCCEED)),
        (L.RUNNING, None, J.RUNNING, R.EXITED, 3, False, ReportEffect(L.EXITED, 3, E.FAIL)),
        (L.RUNNING, None, J.RUNNING, R.EXITED, -15, True, ReportEffect(L.EXITED, -15, E.REQUEUE)),
        (L.REVOKED, None, J.RUNNING, R.EXITED, -9, False, ReportEffect(L.EXITED, -9, E.REQUEUE)),
        (L.RUNNING, None, J.FAILED, R.EXITED, 1, False, ReportEffect(L.EXITED, 1)),
        (L.EXITED, 0, J.SUCCEEDED, R.EXITED, 0, False, ReportEffect()),
        (
            L.EXITED,
            0,
            J.SUCCEEDED,
            R.EXITED,
            1,
            False,
            ReportEffect(refused="attempt a has already stopped (exited)"),
        ),
        (L.CHECKPOINTED, None, J.SUSPENDED, R.CHECKPOINTED, None, False, ReportEffect()),
        (
            L.CHECKPOINTED,
            None,
            J.SUSPENDED,
            R.RUNNING,
            None,
            False,
            ReportEffect(refused="attempt a has already stopped (checkpointed)"),
        ),
        (
            L.LOST,
            None,
            J.PENDING,
            R.EXITED,
            0,
            False,
            ReportEffect(
                refused="attempt a was lost with its node; its job went back to the queue"
            ),
        ),
    ],
)
def test_what_a_report_does(
    lease: LeaseState,
    exit_code: int | None,
    job: JobState,
    report: Report,
    reported_code: int | None,
    stop_requested: bool,
    effect: ReportEffect,
) -> None:
    got = report_effect("a", lease, exit_code, "j", job, report, reported_code, stop_requested)
    assert got == effect


def test_a_superseded_attempt_changes_nothing_whatever_it_reports() -> None:
    """Issue 16: a revoked attempt whose successor started is fenced for every report; a live
    one is not affected by the argument."""
    for report, code in itertools.product(Report, (None, 0, 1, -9)):
        effect = report_effect("a", L.REVOKED, None, "j", J.RUNNING, report, code, False, "b")
        assert effect == ReportEffect(refused="attempt a was revoked and attempt b has taken over")
    live = report_effect("a", L.RUNNING, None, "j", J.RUNNING, R.EXITED, 0, False, "b")
    assert live == ReportEffect(L.EXITED, 0, E.SUCCEED)


def test_every_report_effect_is_a_legal_lease_move() -> None:
    """Whatever an agent reports, in whatever state, the rule never asks for an illegal move:
    the shell's writes (which enforce the moves) never fail on a report."""
    for lease, job, report, code, asked in itertools.product(
        LeaseState, JobState, Report, (None, 0, 1, -9), (False, True)
    ):
        effect = report_effect("a", lease, code, "j", job, report, code, asked)
        if effect.lease is not None:
            assert lease_transition(lease, effect.lease) is effect.lease
        if effect.job is not None:
            assert effect.refused is None and not job.terminal


def test_stopped_and_lost_leases_are_final_and_live_ones_can_stop() -> None:
    for final in (L.CHECKPOINTED, L.EXITED, L.LOST):
        assert not LEASE_ALLOWED[final]
        with pytest.raises(IllegalTransition, match="lease"):
            lease_transition(final, L.RUNNING)
    for live in LIVE_LEASES:
        assert {L.REVOKED, L.LOST, L.CHECKPOINTED, L.EXITED} <= LEASE_ALLOWED[live]
    with pytest.raises(IllegalTransition):
        lease_transition(L.RUNNING, L.ISSUED)


def test_terminal_jobs_have_no_way_out() -> None:
    for state in (J.SUCCEEDED, J.FAILED, J.CANCELLED):
        with pytest.raises(IllegalTransition, match=f"a {state.value} job cannot become"):
            transition(state, J.RUNNING)
    assert transition(J.RUNNING, J.PENDING) is J.PENDING
