"""shockwave.policies.policy.time_scaled: a policy run on a clock X times faster gets its duration
knobs divided by X (``shockwave replay``), the solver's wall-clock limit excepted."""

from __future__ import annotations

from shockwave.policies.policy import get_policy, make_params, service_params, time_scaled


def test_every_duration_knob_is_divided_and_nothing_else() -> None:
    params = make_params(get_policy("shockwave"))
    scaled = time_scaled(params, 120.0)
    assert scaled.restart_overhead_s == params.restart_overhead_s / 120
    assert scaled.predictor.unknown_epoch_seconds == params.predictor.unknown_epoch_seconds / 120
    assert scaled.planner.time_limit_s == params.planner.time_limit_s  # the solver's wall time
    assert scaled.planner.makespan_weight == params.planner.makespan_weight
    assert scaled.fairness_exponent == params.fairness_exponent


def test_the_gavel_mechanisms_gate_and_credit_follow_the_clock() -> None:
    gavel = get_policy("gavel")
    mechanism = service_params(
        gavel, replan="reactive", solver_time_limit_s=None, time_scale=100.0
    ).mechanism
    default = make_params(gavel).mechanism
    assert (
        mechanism.min_seconds_between_allocations == default.min_seconds_between_allocations / 100
    )
    assert mechanism.initial_credit_s == default.initial_credit_s / 100
    unscaled = service_params(gavel, replan="reactive", solver_time_limit_s=None)
    assert unscaled == make_params(gavel)
