"""Long-term fairness and efficiency estimators (paper appendix "Shockwave design details").

- Finish-time fairness estimate of job j:

      rho_hat = (L + W + R_hat * N_avg) / (P_hat * N_avg)

  L attained service, W waiting time (so L + W is the job's age), P_hat the predicted total
  exclusive run time, R_hat the predicted remaining one, N_avg the contention factor: the number
  of jobs requesting GPUs per GPU in the cluster, averaged over the rounds the job has been in
  the system, and at least 1. rho_hat > 1 says the job is on course to finish later than under an
  equal share of the cluster.
- Makespan lower bound of the remaining work (Coffman et al.):

      H = max(sum_j R_j / M, max_j R_j)

  with R_j the remaining run time of job j, M the GPUs. For a plan, R_j is what remains after the
  planning window; the planner keeps H as a regularizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def finish_time_fairness(
    age_s: float, remaining_s: float, total_s: float, contention: float
) -> float:
    """rho_hat = (age + R_hat N) / (P_hat N); ``contention`` is floored at 1."""
    n = max(1.0, contention)
    if total_s <= 0:
        return 1.0
    return (max(0.0, age_s) + max(0.0, remaining_s) * n) / (total_s * n)


def lifetime_contention(
    contention_sum: float, rounds: int, current: float, remaining_rounds: float
) -> float:
    """N over a job's whole life if each round it still needs runs at today's contention:
    (sum of its rounds' contention so far + ``current`` x ``remaining_rounds``) / (its rounds
    so far + ``remaining_rounds``), at least 1. Finish-time fairness divides by the mean over
    the job's life, and the rounds it has yet to run are in that mean: where contention has
    fallen since the job arrived, the mean of the past alone promises a later deadline than
    the job will be held to."""
    ahead = max(0.0, remaining_rounds)
    total_rounds = rounds + ahead
    if total_rounds <= 0:
        return max(1.0, current)
    return max(1.0, (contention_sum + max(1.0, current) * ahead) / total_rounds)


def forecast_contention(
    past: Sequence[tuple[float, int]],
    remaining_s: Sequence[float],
    total_gpus: int,
    round_s: float,
) -> list[float]:
    """Each present job's N over its whole life, its future forecast: (its contention summed
    over its rounds so far + the jobs per GPU summed over the rounds it has left) / (its rounds
    so far + the rounds it has left), at least 1. ``past``: each job's (contention sum, rounds);
    ``remaining_s``: its predicted remaining run time, in the same order.

    The forecast lets the jobs present share the cluster equally from now on with no arrival:
    with n jobs each runs at min(1, G/n) of its exclusive speed, so the shortest remainders end
    first, the jobs left speed up and the jobs per GPU fall as they end. Where contention is
    about to fall (the end of a burst of arrivals) a long job's life runs on into the quiet
    that follows, which the mean of its past alone does not see and finish-time fairness by
    its own contention does; where jobs keep arriving the forecast is low, and the next
    decisions count them as they come."""
    if len(past) != len(remaining_s):
        raise ValueError("past and remaining_s must have one entry per job")
    gpus = max(1, total_gpus)
    length = max(round_s, 1e-9)
    order = sorted(range(len(remaining_s)), key=lambda i: max(0.0, remaining_s[i]))
    forecast = [1.0] * len(remaining_s)
    clock = integral = done = 0.0
    for k, i in enumerate(order):
        present = len(order) - k
        left = max(0.0, remaining_s[i])
        step = (left - done) / min(1.0, gpus / present)
        clock += step
        integral += step * present / gpus
        done = left
        total, rounds = past[i]
        span = rounds + clock / length
        if span > 0:
            forecast[i] = max(1.0, (total + integral / length) / span)
    return forecast


def contention_factor(active_jobs: int, total_gpus: int) -> float:
    """Jobs requesting GPUs per GPU of the cluster, at least 1 (paper appendix)."""
    return max(1.0, active_jobs / total_gpus)


def makespan_lower_bound(remaining_s: Iterable[float], total_gpus: int) -> float:
    """H = max(sum R / M, max R) over the jobs' remaining run times (0 for no job)."""
    values = [max(0.0, r) for r in remaining_s]
    if not values:
        return 0.0
    return max(sum(values) / total_gpus, max(values))
