"""The cluster simulator against closed forms: an M/D/1 queue's waits (Lindley's recursion exactly,
the Pollaczek-Khinchine mean within its sampling error), a fixed batch's makespan, chunked prefill,
prefix hits; the routing policies on constructed cases; the step profile's fit."""
import collections
import dataclasses
import itertools
import math
import os
import random
import statistics
import subprocess
import sys
import time

import pytest

from minillm.router.policies import LeastLoaded, PrefixAware, ReplicaView, RoundRobin, make_policy
from minillm.sim import SimRequest, StepProfile, simulate
from minillm.sim.fleet_replay import _line
from minillm.sim.plan import SEEDS, predict, summary
from minillm.sim.replica import copies

PROFILE = StepProfile(fixed=0.004, per_prefill_token=0.0005, per_decode_seq=0.002, per_context_token=1e-5)


def poisson_requests(n: int, rate: float, seed: int, prompt: int = 10, output: int = 1) -> list[SimRequest]:
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(SimRequest(arrival=t, prompt_tokens=prompt, output_tokens=output, request_id=str(i)))
    return out


def test_md1_waits_follow_lindleys_recursion_and_the_pollaczek_khinchine_mean():
    service = PROFILE.step_time(10, 0, 0)  # one prefill step that also samples the only token
    rate = 0.7 / service                   # utilisation rho = 0.7
    requests = poisson_requests(40_000, rate, seed=1)
    simulate(requests, PROFILE, max_num_seqs=1)
    waits = [r.first_scheduled - r.arrival for r in requests]
    expected, w = [], 0.0
    for prev, r in zip([None, *requests], requests):
        if prev is not None:
            w = max(0.0, w + service - (r.arrival - prev.arrival))
        expected.append(w)
    assert waits == pytest.approx(expected, abs=1e-9)
    rho = rate * service
    mean = rho * service / (2 * (1 - rho))  # M/D/1 mean wait in queue
    assert sum(waits) / len(waits) == pytest.approx(mean, rel=0.06)
    assert all(r.token_times == [r.first_scheduled + service] for r in requests[:100])


def test_an_mg1_queue_draws_its_steps_from_the_spread_and_meets_the_pollaczek_khinchine_mean():
    """A profile with a measured spread: each step costs its price times a ratio drawn from it. With one
    sequence at a time that is an M/G/1 queue: the waits follow Lindley's recursion over the drawn service
    times, every ratio is drawn about equally often, and the mean wait is lambda E[S^2] / (2 (1 - rho)),
    30% above what the same mean without the spread (M/D/1) gives: a deterministic step model of the same
    mean would predict the waits short."""
    spread = (0.5, 0.75, 1.0, 1.0, 1.25, 2.5)
    profile = dataclasses.replace(PROFILE, spread=spread)
    price = PROFILE.step_time(10, 0, 0)
    mean, second = price * statistics.fmean(spread), price ** 2 * statistics.fmean(x * x for x in spread)
    rate = 0.7 / mean
    requests = poisson_requests(40_000, rate, seed=1)
    simulate(requests, profile, max_num_seqs=1)
    services = [r.token_times[0] - r.first_scheduled for r in requests]
    ratios = collections.Counter(round(s / price, 9) for s in services)
    assert set(ratios) == set(spread)
    assert all(n / len(services) == pytest.approx(spread.count(x) / len(spread), abs=0.01) for x, n in ratios.items())
    waits, expected, w = [r.first_scheduled - r.arrival for r in requests], [], 0.0
    for k, r in enumerate(requests):
        if k:
            w = max(0.0, w + services[k - 1] - (r.arrival - requests[k - 1].arrival))
        expected.append(w)
    assert waits == pytest.approx(expected, abs=1e-9)
    pollaczek_khinchine = rate * second / (2 * (1 - 0.7))
    assert statistics.fmean(waits) == pytest.approx(pollaczek_khinchine, rel=0.06)
    assert pollaczek_khinchine == pytest.approx(1.3 * 0.7 * mean / (2 * (1 - 0.7)), rel=0.01)  # 1.3 x M/D/1


def test_a_spread_run_repeats_with_its_seed_and_differs_with_another():
    profile = dataclasses.replace(PROFILE, spread=(0.8, 1.0, 1.3))
    runs = {}
    for seed in (0, 0, 1):
        requests = poisson_requests(50, 40.0, seed=2, output=6)
        simulate(requests, profile, replicas=2, max_num_seqs=4, seed=seed)
        runs.setdefault(seed, []).append([r.token_times for r in requests])
    assert runs[0][0] == runs[0][1] and runs[1][0] != runs[0][0]
    exact = [poisson_requests(50, 40.0, seed=2, output=6) for _ in range(2)]
    for seed, requests in enumerate(exact):  # no spread: the seed changes nothing
        simulate(requests, PROFILE, replicas=2, max_num_seqs=4, seed=seed)
    assert [r.token_times for r in exact[0]] == [r.token_times for r in exact[1]]


def test_predict_gives_the_median_figures_of_its_seeded_runs():
    profile = dataclasses.replace(PROFILE, spread=(0.6, 1.0, 1.9))
    requests = poisson_requests(60, 60.0, seed=4, output=5)
    runs = [summary(simulate(copies(requests), profile, max_num_seqs=4, seed=s).requests) for s in range(SEEDS)]
    predicted = predict(requests, profile, max_num_seqs=4)
    for key in ("ttft_p99", "tpot_median", "output_throughput"):
        assert predicted[key] == statistics.median(run[key] for run in runs)
    assert len({run["ttft_p99"] for run in runs}) > 1  # the runs differ: the median means something
    assert all(r.token_times == [] for r in requests)  # the caller's requests are left as they were


@pytest.mark.parametrize("batch, prompt, output", [(1, 7, 5), (8, 33, 12), (5, 1, 2)])
def test_a_fixed_batch_finishes_at_the_closed_form_makespan(batch, prompt, output):
    requests = [SimRequest(0.0, prompt, output, request_id=str(i)) for i in range(batch)]
    result = simulate(requests, PROFILE, max_num_seqs=batch, max_num_batched_tokens=batch * prompt)
    makespan = PROFILE.step_time(batch * prompt, 0, 0) + sum(
        PROFILE.step_time(0, batch, batch * (prompt + k)) for k in range(1, output))
    assert result.duration == pytest.approx(makespan, rel=1e-12)
    assert all(len(r.token_times) == output for r in requests)
    assert result.replicas[0].steps == output


def test_a_prompt_longer_than_the_budget_is_chunked_over_steps():
    r = SimRequest(0.0, prompt_tokens=250, output_tokens=1)
    simulate([r], PROFILE, max_num_batched_tokens=100)
    assert r.token_times[0] == pytest.approx(2 * PROFILE.step_time(100, 0, 0) + PROFILE.step_time(50, 0, 0))


def test_a_shared_prefix_is_computed_once_per_replica():
    first = SimRequest(0.0, 100, 4, prefix=("system", 80))
    second = SimRequest(1.0, 120, 4, prefix=("system", 80))
    simulate([first, second], PROFILE)
    assert (first.cached_tokens, second.cached_tokens) == (0, 80)
    assert second.token_times[0] - second.first_scheduled == pytest.approx(PROFILE.step_time(40, 0, 0))


def test_a_request_larger_than_the_pool_is_refused():
    with pytest.raises(ValueError, match="needs 8 KV blocks, more than the replica's 4"):
        simulate([SimRequest(0.0, 100, 28)], PROFILE, kv_blocks=4, block_size=16)


def test_round_robin_takes_turns_and_skips_dead_replicas():
    policy = RoundRobin()
    views = [ReplicaView(0, 0), ReplicaView(9, 0, alive=False), ReplicaView(3, 0)]
    assert [policy.choose(views, 10) for _ in range(4)] == [0, 2, 0, 2]


def test_least_loaded_takes_the_lightest_and_breaks_ties_by_index():
    views = [ReplicaView(3, 50), ReplicaView(1, 0), ReplicaView(1, 0), ReplicaView(0, 0, alive=False)]
    assert LeastLoaded().choose(views, 10) == 1


def test_prefix_aware_follows_the_cache_until_the_load_gap_exceeds_its_slack():
    policy = PrefixAware(slack=4)
    assert policy.choose([ReplicaView(2, 0), ReplicaView(6, 90), ReplicaView(3, 40)], 100) == 1  # gap 4: the hit
    assert policy.choose([ReplicaView(2, 0), ReplicaView(7, 90), ReplicaView(3, 40)], 100) == 2  # gap 5: next best
    assert policy.choose([ReplicaView(2, 0), ReplicaView(2, 0)], 100) == 0  # nothing cached: the least loaded
    with pytest.raises(ValueError, match="must be one of round_robin, least_loaded, prefix_aware"):
        make_policy("random")


def test_prefix_aware_routing_raises_the_hit_rate_on_a_multi_tenant_workload():
    """16 tenants' system prompts; each replica's prefix cache holds about 4 of them."""
    def workload():
        rng = random.Random(0)
        return [SimRequest(i * 0.01, 300 + rng.randrange(40), 8, prefix=(f"tenant{rng.randrange(16)}", 256),
                           request_id=str(i)) for i in range(400)]
    hits = {}
    for name in ("round_robin", "prefix_aware"):
        requests = workload()
        simulate(requests, PROFILE, replicas=4, router=name, prefix_cache_tokens=4 * 350)
        hits[name] = sum(r.cached_tokens for r in requests) / sum(r.prompt_tokens for r in requests)
    assert hits["prefix_aware"] > hits["round_robin"] + 0.1


CURVED = StepProfile(fixed=0.006, per_prefill_token=2e-4, per_decode_seq=2e-4, per_context_token=3e-6,
                     token_curve=((2, 0.004), (3, 0.0045), (4, 0.005), (8, 0.006), (16, 0.009), (32, 0.012),
                                  (64, 0.02), (128, 0.035), (256, 0.06), (300, 0.07)))


def test_fit_recovers_a_measured_profile_from_exact_steps():
    """Steps priced by a known curve (a jump from one token to two, as a CPU's matrix-vector products
    give way to matrix products, then rising) with random prefill, decode and context: the fit finds
    fixed, per context token and every point of the curve."""
    rng = random.Random(3)
    work = [(rng.randrange(300), rng.randrange(1, 17), rng.randrange(5000)) for _ in range(200)]
    work = [(p, d, c) for p, d, c in work if p + d <= 300] + [(300, 0, 0), (0, 1, 40), (0, 2, 80), (1, 2, 80)]
    fitted = StepProfile.fit([(p, d, c, CURVED.step_time(p, d, c)) for p, d, c in work])
    assert fitted.fixed == pytest.approx(CURVED.fixed, rel=1e-6)
    assert fitted.per_context_token == pytest.approx(CURVED.per_context_token, rel=1e-6)
    assert [n for n, _ in fitted.token_curve] == [n for n, _ in CURVED.token_curve]
    assert [s for _, s in fitted.token_curve] == pytest.approx([s for _, s in CURVED.token_curve], rel=1e-6)
    assert fitted.per_decode_seq == pytest.approx(0.07 / 299, rel=1e-6)  # the curve's mean, on past its end


@pytest.mark.parametrize("unit", [1e-2, 1e-4])
def test_fit_profile_prices_steps_alike_in_any_unit_of_time(unit):
    """A light load's steps (a few decodes, some one-token prompts) timed 100 or 10,000 times faster (a fast
    GPU, a fake clock): the same fit, in that unit. Coefficients that small once fell below the solver's
    tolerance, which is in the gradient's units: `fixed` was dropped, a one-token prompt's step priced 0,
    and fit_profile divided by that price (ZeroDivisionError)."""
    from minillm.sim.calibrate import fit_profile
    rng = random.Random(8)
    work = [(rng.choice([0, 0, 0, 1, rng.randrange(1, 64)]), rng.randrange(4), rng.randrange(300)) for _ in range(100)]
    work = [(p, d, c * (d > 0), CURVED.step_time(p, d, c * (d > 0)) * rng.uniform(0.8, 1.2))
            for p, d, c in work if p + d > 0]
    woke = [rng.random() < 0.1 for _ in work]
    seconds, fast = fit_profile(work, woke), fit_profile([(p, d, c, t * unit) for p, d, c, t in work], woke)
    assert fast.fixed == pytest.approx(seconds.fixed * unit, rel=1e-6)
    assert fast.per_context_token == pytest.approx(seconds.per_context_token * unit, rel=1e-6)
    assert [n for n, _ in fast.token_curve] == [n for n, _ in seconds.token_curve]
    assert [s for _, s in fast.token_curve] == pytest.approx([s * unit for _, s in seconds.token_curve], rel=1e-6)
    assert fast.warmup == pytest.approx(seconds.warmup, rel=1e-6) and fast.spread == pytest.approx(seconds.spread)


@pytest.mark.parametrize("seconds", [0.0, -1e-6, float("nan")])
def test_fit_profile_refuses_a_step_timed_zero_or_nan_naming_that_step(seconds):
    from minillm.sim.calibrate import fit_profile
    steps = [(16, 0, 0, 0.01), (0, 1, 20, 0.005), (0, 1, 40, seconds), (0, 2, 80, 0.006), (0, 2, 90, 0.006)]
    with pytest.raises(ValueError, match=rf"step 2, \(0, 1, 40\) .* took {seconds}"):
        fit_profile(steps, [False] * len(steps))


def test_fit_keeps_how_far_measured_steps_stray_from_their_price():
    """Exact steps leave a spread of ratio 1; steps that ran 10% fast, on time or 25% slow in equal shares
    (a machine that drifts) leave those three levels relative to one another, in equal shares."""
    rng = random.Random(6)
    work = [(rng.randrange(200), rng.randrange(1, 9), rng.randrange(3000)) for _ in range(300)]
    exact = StepProfile.fit([(p, d, c, CURVED.step_time(p, d, c)) for p, d, c in work])
    assert len(exact.spread) == 64 and exact.spread == pytest.approx([1.0] * 64, rel=1e-6)
    levels = (0.9, 1.0, 1.25)  # every step measured three times, once at each: the fit is CURVED times a constant
    noisy = StepProfile.fit([(p, d, c, CURVED.step_time(p, d, c) * x) for p, d, c in work for x in levels])
    scale = noisy.spread[32]  # the middle of the spread: the steps on time
    shares = [sum(r == pytest.approx(x * scale, rel=1e-6) for r in noisy.spread) / 64 for x in levels]
    assert shares == pytest.approx([1 / 3] * 3, abs=2 / 64)
    assert list(noisy.spread) == sorted(noisy.spread)
    assert "90% of steps take" in noisy.describe()
    assert (noisy.strays(0), noisy.strays(0.5), noisy.strays(1)) == (noisy.spread[0], scale, noisy.spread[-1])
    assert exact.strays(0.95) == pytest.approx(1.0) and PROFILE.strays(0.95) == 1.0  # no spread: every step on price
    with pytest.raises(ValueError, match="share must be in"):
        noisy.strays(1.5)
    with pytest.raises(ValueError, match="spread must be > 0"):
        StepProfile(0.001, 0.0, 0.0, 0.0, spread=(1.0, 0.0))


def test_a_curved_profile_prices_prompt_and_decode_tokens_on_one_curve_between_its_points():
    assert CURVED.step_time(0, 1, 0) == pytest.approx(0.006)                      # one token: fixed
    assert CURVED.step_time(0, 2, 0) == pytest.approx(0.010)                      # the jump to two
    assert CURVED.step_time(5, 1, 0) == CURVED.step_time(0, 6, 0) == pytest.approx(0.006 + 0.0055)  # 4..8 at 6
    assert CURVED.step_time(0, 1, 1000) == pytest.approx(0.006 + 0.003)           # context
    assert CURVED.step_time(344, 0, 0) == pytest.approx(0.006 + 0.07 + 44 * 2e-4)  # past the last point


def test_the_fitted_curve_never_falls_and_no_coefficient_is_negative_on_noisy_steps():
    rng = random.Random(5)
    work = [(rng.choice([0, rng.randrange(1, 200)]), rng.randrange(0, 9), rng.randrange(3000)) for _ in range(300)]
    work = [w for w in work if w[0] + w[1] > 0]
    fitted = StepProfile.fit([(p, d, c, CURVED.step_time(p, d, c) * rng.uniform(0.7, 1.4)) for p, d, c in work])
    values = [s for _, s in fitted.token_curve]
    assert min(values) >= 0 and values == sorted(values)
    assert fitted.fixed >= 0 and fitted.per_context_token >= 0 and fitted.per_decode_seq >= 0


def test_nnls_meets_the_karush_kuhn_tucker_conditions_on_random_problems():
    import torch

    from minillm.sim.step_profile import nnls
    gen = torch.Generator().manual_seed(0)
    for _ in range(100):
        m, n = (int(v) for v in torch.randint(2, 25, (2,), generator=gen))
        a, b = torch.randn(m, n, generator=gen, dtype=torch.float64), torch.randn(m, generator=gen, dtype=torch.float64)
        x = nnls(a, b)
        gradient = a.T @ (b - a @ x)  # >= 0 would lower the error: only where x sits on its bound, and <= 0 there
        assert (x >= 0).all() and (gradient <= 1e-9).all() and (gradient[x > 0].abs() <= 1e-9).all()


def test_a_cold_replica_pays_its_warmup_factor_on_each_step_after_an_idle_pause_until_it_is_warm():
    """Factors 2.0 (k = 0), 1.5 (k = 1), 1.25 (k = 2-3): a lone request's steps cost price x factor in turn,
    then the price; a second request after an idle pause starts cold again, a step that follows a busy
    one does not."""
    profile = dataclasses.replace(PROFILE, warmup=(2.0, 1.5, 1.25))
    a, b = SimRequest(0.0, 10, 6), SimRequest(5.0, 10, 2)
    simulate([a, b], profile)
    decode = [profile.step_time(0, 1, 10 + i) for i in range(1, 6)]
    steps = [2.0 * profile.step_time(10, 0, 0), 1.5 * decode[0], 1.25 * decode[1], 1.25 * decode[2], *decode[3:]]
    assert a.token_times == pytest.approx(list(itertools.accumulate(steps)), rel=1e-12)
    assert b.token_times == pytest.approx([5.0 + 2.0 * profile.step_time(10, 0, 0),
                                           5.0 + 2.0 * profile.step_time(10, 0, 0) + 1.5 * decode[0]], rel=1e-12)


def test_cold_steps_fall_in_their_bins_and_a_warmup_is_validated():
    profile = dataclasses.replace(PROFILE, warmup=(1.6, 1.5, 1.4, 1.3, 1.2, 1.1))
    assert [profile.cold(k) for k in (0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 10_000)] == \
        [1.6, 1.5, 1.4, 1.4, 1.3, 1.3, 1.2, 1.2, 1.1, 1.1, 1.0, 1.0]
    assert PROFILE.cold(0) == 1.0  # no warmup measured: every step is warm
    with pytest.raises(ValueError, match="warmup"):
        dataclasses.replace(PROFILE, warmup=(1.2, 0.0))
    with pytest.raises(ValueError, match="warmup"):
        dataclasses.replace(PROFILE, warmup=(1.1,) * 7)


def test_fit_profile_recovers_a_known_warmup_and_the_warm_price():
    """Steps priced by CURVED, slowed after each idle pause by known factors per bin and jittered by +-5%
    (a pause ends with a prompt's step; prompts also arrive while the replica is warm): fit_profile finds
    the factors (within 3%) and the warm price (within 3%), and its spread holds the jitter only (a fit
    that ignored the pauses would price every step high and widen the spread)."""
    from minillm.sim.calibrate import fit_profile
    factors = (1.3, 1.25, 1.2, 1.12, 1.06, 1.02)
    rng, steps, woke = random.Random(11), [], []
    for _ in range(60):  # 60 bursts of 40 steps, each after an idle pause
        for k in range(40):
            prompt = k == 0 or rng.random() < 0.15
            p, d, c = (rng.randrange(16, 200), 0, 0) if prompt else (0, rng.randrange(1, 9), rng.randrange(3000))
            jitter = rng.choice((0.95, 1.0, 1.05))
            steps.append((p, d, c, CURVED.step_time(p, d, c) * dataclasses.replace(CURVED, warmup=factors).cold(k)
                          * jitter))
            woke.append(k == 0)
    fitted = fit_profile(steps, woke)
    assert fitted.warmup == pytest.approx(factors, rel=0.03)
    assert [fitted.step_time(0, d, 500) for d in (1, 4, 8)] == \
        pytest.approx([CURVED.step_time(0, d, 500) for d in (1, 4, 8)], rel=0.03)
    assert fitted.strays(0.02) > 0.93 and fitted.strays(0.98) < 1.07


def test_a_calibration_runs_prompts_of_every_length_alone_after_idle_pauses():
    """calibration_workload: a burst and a trickle of `requests`, then half as many lone prompts with short
    answers. Simulated on a replica priced like the tiny model here, most lone prompts find it idle and run
    by themselves, over the whole range of prompt lengths; the burst and the trickle alone give few such
    steps (which is why the lone prompts are there: a light load is made of them)."""
    from minillm.sim.calibrate import calibration_workload
    work = calibration_workload(requests=48, seed=1)
    burst, trickle, lone = work[:24], work[24:48], work[48:]
    assert len(work) == 72 and {r.arrival for r in burst} == {0.0}
    assert len({r.request_id for r in work}) == 72
    assert min(r.arrival for r in lone) > max(r.arrival for r in trickle) + 0.9
    assert all(2 <= r.output_tokens <= 8 for r in lone) and all(r.output_tokens >= 8 for r in trickle)
    here = StepProfile(fixed=0.0035, per_prefill_token=1.5e-4, per_decode_seq=1e-3, per_context_token=1e-6)
    done = simulate(copies(work), here).requests

    def alone(phase: list[SimRequest]) -> list[SimRequest]:
        """The requests of a phase that arrived to an idle replica and ran their prompt by themselves."""
        ran = {r.request_id: r for r in done}
        return [ran[r.request_id] for r in phase
                if all(o.token_times[-1] <= r.arrival or o.arrival >= ran[r.request_id].token_times[0]
                       for o in done if o.request_id != r.request_id)]
    lone_alone = alone(lone)
    assert len(lone_alone) >= 0.6 * len(lone)
    assert min(r.prompt_tokens for r in lone_alone) < 50 and max(r.prompt_tokens for r in lone_alone) > 150
    assert len(alone(burst + trickle)) <= 0.2 * len(lone_alone)


def ar1_ratios(rho: float, n: int, seed: int) -> list[float]:
    """n step ratios whose normal scores follow an AR(1) process of coefficient rho, each a log-normal draw."""
    rng, z, out = random.Random(seed), 0.0, []
    for _ in range(n):
        z = rho * z + (1 - rho * rho) ** 0.5 * rng.gauss(0.0, 1.0)
        out.append(math.exp(0.15 * z))
    return out


@pytest.mark.parametrize("rho, seed", [(0.8, 8), (0.8, 9), (0.95, 10)])
def test_fit_measures_how_much_of_its_pace_a_step_keeps_from_the_last(rho, seed):
    """Steps priced by CURVED whose ratios to their price follow an AR(1) pace: the fitted persistence is
    that pace's rho, from the steps in the order they ran; shuffled, they keep little (the estimate
    matches the mean correlation over 32 lags, which is noisy near 0: up to ~0.2 on 4000 shuffled steps)."""
    rng = random.Random(7)
    work = [(rng.randrange(200), rng.randrange(1, 9), rng.randrange(3000)) for _ in range(4000)]
    steps = [(p, d, c, CURVED.step_time(p, d, c) * r) for (p, d, c), r in zip(work, ar1_ratios(rho, 4000, seed))]
    assert StepProfile.fit(steps).persistence == pytest.approx(rho, abs=0.06)
    rng.shuffle(steps)
    assert StepProfile.fit(steps).persistence < 0.25
    assert StepProfile.fit(steps[:40]).persistence == 0.0  # fewer than 2 x LAGS steps: too few to tell
    with pytest.raises(ValueError, match="persistence must be in"):
        dataclasses.replace(PROFILE, persistence=1.0)
    with pytest.raises(ValueError, match="persistence must be in"):
        dataclasses.replace(PROFILE, persistence=-0.1)


def test_a_persistent_pace_keeps_the_spread_and_makes_consecutive_steps_alike():
    """Draws at persistence rho: each ratio alone still follows the spread (every value about equally
    often), and consecutive draws' normal scores correlate rho; at 0 they do not correlate."""
    from minillm.sim.pace import autocorrelation, normal_scores
    spread = tuple(0.7 + 0.01 * i for i in range(64))
    for rho in (0.0, 0.8):
        profile, rng, pace = dataclasses.replace(PROFILE, spread=spread, persistence=rho), random.Random(3), 0.0
        ratios = []
        for _ in range(20_000):
            ratio, pace = profile.draw(rng, pace)
            ratios.append(ratio)
        counts = collections.Counter(ratios)
        assert set(counts) == set(spread) and max(counts.values()) / min(counts.values()) < 2.0
        assert autocorrelation(normal_scores(ratios), 1) == pytest.approx(rho, abs=0.03)
    assert PROFILE.draw(random.Random(0), 0.4) == (1.0, 0.4)  # no spread: every step on price


def test_long_steps_keep_a_spread_of_their_own_and_draw_from_it():
    """Short steps (decodes) jittered +-30%, long ones (prompts of 100+ tokens, many one-token steps' price)
    +-5%: the fit keeps a narrow long_spread beside the wide spread, and a simulated step draws from the
    one its price calls for; with too few long steps measured there is no long_spread."""
    from minillm.sim.step_profile import LONG_STEP
    rng = random.Random(12)
    work = [(rng.randrange(100, 400), 0, 0) if rng.random() < 0.2 else (0, rng.randrange(1, 4), rng.randrange(1000))
            for _ in range(1000)]
    jitter = {True: (0.95, 1.0, 1.05), False: (0.7, 1.0, 1.3)}
    steps = [(p, d, c, CURVED.step_time(p, d, c) * rng.choice(jitter[p > 0])) for p, d, c in work]
    fitted = StepProfile.fit(steps)
    assert all(CURVED.step_time(p, 0, 0) >= LONG_STEP * CURVED.fixed for p in range(100, 400))
    assert all(CURVED.step_time(0, d, c) < LONG_STEP * CURVED.fixed for d in range(1, 4) for c in (0, 999))
    assert fitted.long_spread[-1] / fitted.long_spread[0] == pytest.approx(1.05 / 0.95, rel=0.03)
    assert fitted.spread[-1] / fitted.spread[0] > 1.7
    assert "for steps priced at 3 one-token steps or more" in fitted.describe()
    assert (fitted.strays(0, long=True), fitted.strays(1, long=True)) == (fitted.long_spread[0], fitted.long_spread[-1])
    one_each = dataclasses.replace(CURVED, spread=(1.0,), long_spread=(1.5,))
    assert "(150% to 150% for steps priced at 3" in one_each.describe()
    few = StepProfile.fit([s for s in steps if s[0] == 0] + [s for s in steps if s[0] > 0][:20])
    assert few.long_spread == () and few.spread
    profile = dataclasses.replace(PROFILE, spread=(0.5,), long_spread=(1.5,))
    long, short = LONG_STEP * PROFILE.fixed, 0.99 * LONG_STEP * PROFILE.fixed
    for rho in (0.0, 0.8):
        p = dataclasses.replace(profile, persistence=rho)
        assert p.draw(random.Random(0), 0.0, long)[0] == 1.5 and p.draw(random.Random(0), 0.0, short)[0] == 0.5
    a = SimRequest(0.0, 300, 2)  # a long prompt step, then a short decode step
    simulate([a], profile)
    assert a.token_times == pytest.approx([1.5 * PROFILE.step_time(300, 0, 0),
                                           1.5 * PROFILE.step_time(300, 0, 0) + 0.5 * PROFILE.step_time(0, 1, 301)])
    with pytest.raises(ValueError, match="long_spread must be > 0"):
        dataclasses.replace(PROFILE, spread=(1.0,), long_spread=(0.0,))


def test_a_persistent_pace_widens_the_tpot_tail_that_independent_draws_average_away():
    """The same spread, drawn afresh each step or persisting (rho 0.9): requests' TPOT p50 stays put, its
    p99 grows, since a request's TPOT averages its steps and slow steps now come in spells."""
    spread = tuple(0.6 + 0.0125 * i for i in range(64))
    figures = {}
    for rho in (0.0, 0.9):
        profile = dataclasses.replace(PROFILE, spread=spread, persistence=rho)
        figures[rho] = predict(poisson_requests(300, 20.0, seed=5, output=30), profile, max_num_seqs=8)
    assert figures[0.9]["tpot_median"] == pytest.approx(figures[0.0]["tpot_median"], rel=0.05)
    assert figures[0.9]["tpot_p99"] > 1.1 * figures[0.0]["tpot_p99"]


def test_a_profile_with_a_curve_and_a_spread_survives_save_and_load(tmp_path):
    profile = dataclasses.replace(CURVED, spread=(0.9, 1.0, 1.2), long_spread=(0.95, 1.1), warmup=(1.3, 1.1),
                                  persistence=0.9)
    profile.save(tmp_path / "profile.json")
    loaded = StepProfile.load(tmp_path / "profile.json")
    assert loaded == profile and loaded.step_time(7, 3, 99) == CURVED.step_time(7, 3, 99)


def test_an_agent_session_calls_in_turn_after_each_tool_pause_and_hits_its_own_history():
    from minillm.sim import SimSession
    session = SimSession(start=1.0, calls=((50, 4), (20, 4), (30, 2)), tool_seconds=0.5, system=("sys", 40))
    result = simulate([], PROFILE, sessions=[session])
    calls = result.requests
    assert [r.prompt_tokens for r in calls] == [90, 114, 148]
    assert [r.cached_tokens for r in calls] == [0, 94, 118]  # everything before the newest tokens
    for prev, nxt in zip(calls, calls[1:]):
        assert nxt.arrival == pytest.approx(prev.token_times[-1] + 0.5)


def test_disaggregated_request_prefills_transfers_then_decodes_at_the_closed_form_times():
    r = SimRequest(0.0, prompt_tokens=64, output_tokens=3)
    simulate([r], PROFILE, replicas=1, prefill_replicas=1, transfer_seconds_per_token=1e-4)
    first = PROFILE.step_time(64, 0, 0)
    second = first + 64e-4 + PROFILE.step_time(0, 1, 65)
    assert r.token_times == pytest.approx([first, second, second + PROFILE.step_time(0, 1, 66)], rel=1e-12)


def test_disaggregation_keeps_decodes_from_waiting_behind_long_prompts():
    def mixed():
        rng = random.Random(4)
        decodes = [SimRequest(0.0, 32, 64, request_id=f"d{i}") for i in range(6)]
        prompts = [SimRequest(0.05 + 0.1 * i, 900 + rng.randrange(100), 2, request_id=f"p{i}") for i in range(6)]
        return decodes, decodes + prompts
    worst = {}
    for name, options in (("colocated", {"replicas": 2}), ("disaggregated", {"replicas": 1, "prefill_replicas": 1})):
        decodes, everything = mixed()
        simulate(everything, PROFILE, max_num_batched_tokens=1024, **options)
        worst[name] = max(b - a for r in decodes for a, b in zip(r.token_times[1:], r.token_times[2:]))
    assert worst["disaggregated"] < worst["colocated"] / 3


def test_a_fixed_fleet_costs_its_size_times_the_run():
    result = simulate(poisson_requests(200, 20.0, seed=2), PROFILE, replicas=3)
    assert result.replica_seconds == pytest.approx(3 * result.duration, rel=1e-12)


def test_autoscaling_adds_replicas_only_after_their_startup_and_drains_them_when_idle():
    from minillm.sim.autoscale import Autoscaler, queue_rule
    burst = poisson_requests(600, 200.0, seed=3, prompt=40, output=8)
    autoscaler = Autoscaler(rule=queue_rule(per_replica=16), interval=0.5, startup_seconds=2.0, max_replicas=8)
    result = simulate(burst, PROFILE, replicas=1, autoscaler=autoscaler, max_num_seqs=16)
    late = [r for r in result.requests if r.replica != 0]
    assert len(result.replicas) > 1 and late, "the queue grew, so replicas were added"
    assert min(r.first_scheduled for r in late) >= 0.5 + 2.0  # the first decision, then the startup
    fixed = simulate(poisson_requests(600, 200.0, seed=3, prompt=40, output=8), PROFILE, replicas=1,
                     max_num_seqs=16)
    assert result.duration < fixed.duration
    with pytest.raises(ValueError, match="min_replicas <= max_replicas"):
        Autoscaler(rule=queue_rule(), min_replicas=4, max_replicas=2)


def test_starting_replicas_are_counted_until_they_serve_and_then_only_as_serving():
    from minillm.sim.autoscale import Autoscaler
    seen = []

    def rule(state):
        seen.append((state.now, state.replicas, state.starting))
        return 3
    simulate(poisson_requests(300, 100.0, seed=5), PROFILE, replicas=1, max_num_seqs=8,
             autoscaler=Autoscaler(rule=rule, interval=0.5, startup_seconds=1.2))
    assert seen[0] == (0.5, 1, 0)
    assert seen[1] == (1.0, 1, 2), "two asked for at 0.5 s, not serving yet"
    assert seen[3][1:] == (3, 0), "at 2.0 s both serve (ready at 1.7 s) and none is starting"
    assert all(r + s == 3 for _, r, s in seen[1:])


@pytest.mark.slow
@pytest.mark.subprocess
def test_replay_fleet_runs_every_request_on_real_replicas_in_processes_and_names_a_failed_one():
    """Two real replicas (processes of their own): every request gets all its tokens, after its arrival,
    on one clock; both replicas' steps come back; a replica that cannot start is named, and none is left
    running."""
    from pathlib import Path

    from minillm.sim.calibrate import workload
    from minillm.sim.fleet_replay import replay_fleet
    requests = workload(6, 20.0, seed=0, prompt=(8, 40), output=(2, 6))
    calibration, (steps, woke), knobs, real = replay_fleet("tiny", requests, replicas=2, calibration_requests=4,
                                                           timeout=120)
    assert sorted(r.request_id for r in real) == sorted(r.request_id for r in requests)
    for r in real:
        assert len(r.token_times) == r.output_tokens and r.token_times == sorted(r.token_times)
        assert r.token_times[0] > r.arrival and r.first_scheduled >= r.arrival - 1e-3
    assert len(steps) == len(woke) and sum(p for p, *_ in steps) == sum(r.prompt_tokens for r in requests)
    assert len(calibration[0]) > 0 and knobs["max_num_seqs"] == 16
    with pytest.raises(RuntimeError, match="replica-[01] failed"):
        replay_fleet("no-such-model", requests, replicas=2, calibration_requests=4, timeout=120)
    # this process's own replicas only: the other xdist worker may be running a fleet of its own (the cluster
    # benchmark, the app's cluster page), whose replicas failed this check in a full run
    running = [p for p in Path("/proc").glob("[0-9]*") if b"minillm.sim.fleet_replay" in _read(p / "cmdline")
               and f"PPid:\t{os.getpid()}\n".encode() in _read(p / "status")]
    assert not running


def _read(path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended while we looked
        return b""


@pytest.mark.subprocess
def test_a_replica_that_closes_its_output_before_exiting_is_reported_failed_not_silent(tmp_path):
    """End of output comes before the exit: the caller waits for the exit, and names the failure."""
    exiting = "import os, sys, time; os.close(1); time.sleep(1.0); sys.exit(3)"
    silent = "import time; time.sleep(30)"
    with open(tmp_path / "log", "w+") as log:
        proc = subprocess.Popen([sys.executable, "-c", exiting], stdout=subprocess.PIPE, stderr=log, text=True)
        with pytest.raises(RuntimeError, match=r"replica-0 failed \(exit code 3\)"):
            _line(proc, 0, log, time.monotonic() + 30)
        proc = subprocess.Popen([sys.executable, "-c", silent], stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            with pytest.raises(TimeoutError, match="replica-1 gave no answer in time"):
                _line(proc, 1, log, time.monotonic() + 1.5)
        finally:
            proc.kill()
            proc.wait()
