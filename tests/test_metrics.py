"""Pure metric functions against hand-computed numbers."""
import math

import pytest

from ddlbench.metrics.comm import CommCounter, analytic_wire_bytes, per_step, ring_wire_bytes
from ddlbench.metrics.memory import model_state_bytes_per_rank, optimizer_state_bytes_per_param
from ddlbench.metrics.mfu import MfuError, mfu
from ddlbench.metrics.throughput import scaling_efficiency, scaling_kind, throughput
from ddlbench.metrics.timing import global_step_times, mean_ignoring_missing, percentile, summarize, window_step_time


def test_global_step_time_is_max_over_ranks():
    assert global_step_times([[1.0, 2.0, 3.0], [1.5, 1.0, 3.5]]) == [1.5, 2.0, 3.5]
    with pytest.raises(ValueError):
        global_step_times([[1.0], [1.0, 2.0]])


def test_percentiles_and_summary():
    s = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(s, 50) == 3.0
    assert percentile(s, 10) == pytest.approx(1.4)   # pos 0.4 between 1 and 2
    assert percentile(s, 90) == pytest.approx(4.6)
    out = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert out["median"] == 3.0 and out["mean"] == 3.0
    assert out["std"] == pytest.approx(math.sqrt(2.0))  # population std of 1..5
    assert (out["min"], out["max"]) == (1.0, 5.0)


def test_window_step_time_is_the_slowest_rank_window_per_step():
    # boundaries drift: rank 0 steps 1,3,1,3 and rank 1 steps 3,1,3,1 (both windows 8 s).
    # Per-step maxima sum to 12 s (3 s a step); the window is 8 s: 2 s a step.
    drift = [[1.0, 3.0, 1.0, 3.0], [3.0, 1.0, 3.0, 1.0]]
    assert sum(global_step_times(drift)) == 12.0
    assert window_step_time(drift) == 2.0
    assert window_step_time([[1.0, 1.0], [2.0, 2.0]]) == 2.0   # the slowest rank's window
    with pytest.raises(ValueError):
        window_step_time([[]])


def test_loss_mean_ignores_ranks_without_loss():
    assert mean_ignoring_missing([2.0, float("nan"), 4.0]) == 3.0
    assert math.isnan(mean_ignoring_missing([float("nan")]))


def test_throughput():
    t = throughput(global_batch=64, step_s=0.5, world_size=4, tokens_per_sample=128)
    assert t == {"samples_per_s": 128.0, "tokens_per_s": 16384.0, "samples_per_s_per_device": 32.0}
    assert throughput(8, 0.25, 1)["tokens_per_s"] is None


def test_scaling_efficiency():
    # 100 samples/s on 1 device, 180 on 2 -> (180/2)/(100/1) = 0.9
    assert scaling_efficiency(180.0, 2, 100.0, 1) == pytest.approx(0.9)
    # baseline at 2 devices: 300 on 8 vs 100 on 2 -> (300/8)/(100/2) = 0.75
    assert scaling_efficiency(300.0, 8, 100.0, 2) == pytest.approx(0.75)
    assert scaling_kind({1: 32, 2: 32, 4: 32}) == "strong"
    assert scaling_kind({1: 8, 2: 16, 4: 32}) == "weak"
    assert scaling_kind({1: 8, 2: 12}) == "mixed"


def test_mfu_and_its_guard():
    # 1e9 FLOPs/sample * 100 samples/s / (2 devices * 1e12) = 0.05
    assert mfu(1e9, 100.0, 2, 1e12) == pytest.approx(0.05)
    with pytest.raises(MfuError, match="> 100%"):
        mfu(1e12, 100.0, 1, 1e12)


def test_zero_paper_memory():
    psi = 7_500_000_000  # ZeRO paper Fig. 1: 7.5B params, N = 64, K = 12 (mixed-precision Adam)
    k = optimizer_state_bytes_per_param("adamw", fp32_master_copy=True)
    assert k == 12
    base = model_state_bytes_per_rank(psi, 64, param_bytes=2, grad_bytes=2, optim_bytes=k)
    assert base == 120e9                                        # (2 + 2 + K) * psi
    p_os = model_state_bytes_per_rank(psi, 64, param_bytes=2, grad_bytes=2, optim_bytes=k, shard_optim=True)
    assert p_os == pytest.approx(31.4e9, rel=1e-3)              # 4 psi + K psi / N
    p_os_g = model_state_bytes_per_rank(psi, 64, param_bytes=2, grad_bytes=2, optim_bytes=k,
                                        shard_optim=True, shard_grads=True)
    assert p_os_g == pytest.approx(16.6e9, rel=1e-2)            # 2 psi + 14 psi / N
    p_all = model_state_bytes_per_rank(psi, 64, param_bytes=2, grad_bytes=2, optim_bytes=k,
                                       shard_optim=True, shard_grads=True, shard_params=True)
    assert p_all == pytest.approx(1.875e9)                      # 16 psi / N
    assert optimizer_state_bytes_per_param("sgd", momentum=0.9) == 4
    assert optimizer_state_bytes_per_param("sgd") == 0


def test_comm_accounting():
    c = CommCounter()
    c.add("all_reduce", 100)
    c.add("all_reduce", 50)
    c.add("all_gather", 10)
    totals = c.take()
    assert totals == {"all_reduce": {"bytes": 150, "calls": 2}, "all_gather": {"bytes": 10, "calls": 1}}
    assert c.take() == {}
    assert per_step(totals, 2)["all_reduce"] == {"bytes": 75.0, "calls": 1.0}
    assert ring_wire_bytes({"all_reduce": 1000}, 4) == 1500.0   # 2 * 3/4 * 1000
    # FSDP full shard: 2 all-gathers + 1 reduce-scatter of 1000 bytes on 4 ranks: 3 * 3/4 * 1000
    assert ring_wire_bytes({"all_gather": 2000, "reduce_scatter": 1000}, 4) == 2250.0
    assert ring_wire_bytes({"broadcast": 100, "reduce": 100}, 2) == 100.0  # (N-1)/N each
    assert ring_wire_bytes({"send": 100, "recv": 100, "barrier": 0}, 2) == 100.0
    assert ring_wire_bytes({"all_reduce": 1000}, 1) == 0.0
    assert analytic_wire_bytes(3, 1000, 4) == 2250.0
    assert analytic_wire_bytes(2, 1000, 1) == 0.0


def test_wire_factors_depend_on_the_backend():
    from ddlbench.metrics.comm import wire_factor
    # gloo runs reduce-scatter as an all-reduce of the whole input: 2 (N-1)/N, not (N-1)/N
    assert ring_wire_bytes({"reduce_scatter": 1000}, 4, "nccl") == 750.0
    assert ring_wire_bytes({"reduce_scatter": 1000}, 4, "gloo") == 1500.0
    # gloo reduce: ring reduce-scatter ((N-1)/N) + the root gathers 1/N from each other rank:
    # mean over ranks (N+1)/N x (N-1)/N; at N = 2: 0.75
    assert wire_factor("reduce", 2, "gloo") == 0.75 and wire_factor("reduce", 2, "nccl") == 0.5
    assert wire_factor("reduce", 3, "gloo") == pytest.approx(8 / 9)
    # the rest are the same on both: FSDP full shard on gloo, 2 ranks, Psi = 1000:
    # all-gather 2000 x 1/2 + reduce-scatter 1000 x 1 = 2000 (on NCCL 1500)
    assert ring_wire_bytes({"all_gather": 2000, "reduce_scatter": 1000}, 2, "gloo") == 2000.0
    assert ring_wire_bytes({"all_gather": 2000, "reduce_scatter": 1000}, 2, "nccl") == 1500.0
    assert ring_wire_bytes({"all_reduce": 1000, "send": 10}, 2, "gloo") == 1010.0


def test_gloo_reduce_follows_its_segmented_loop():
    from ddlbench.metrics.comm import gloo_reduce_sent, rank_wire_bytes
    M = 1 << 20
    # 4 MiB on 2 ranks: 1 MiB segments, 4 of them; each rank sends 4 - 2 = 2 (2 MiB), rank 1
    # then sends its 2 MiB chunk to the root: mean (2 + 4) / 2 = 3 MiB = (N+1)/N x (N-1)/N x 4 MiB
    assert gloo_reduce_sent(4 * M, 2) == 3 * M
    # 8 MiB: 8 segments, each rank sends 6 (the loop runs over all of them), rank 1 adds 4 MiB:
    # mean (12 + 4) / 2 = 8 MiB, where the formula says 6 (measured with /proc/self/io: 8.0)
    assert gloo_reduce_sent(8 * M, 2) == 8 * M
    assert gloo_reduce_sent(8 * M, 1) == 0.0
    # the record keeps each reduce call's size; the wire bytes are summed per call
    row = {"reduce": {"bytes": 12 * M, "calls": 2, "sizes": {"|4194304": 1, "2@1|8388608": 1}}}
    assert rank_wire_bytes(row, 2, "gloo") == 11 * M
    assert rank_wire_bytes(row, 2, "nccl") == 6 * M          # ring: (N-1)/N x 12 MiB


def test_analytic_comm_uses_the_backend_and_keeps_the_paper_figure():
    from ddlbench.metrics.comm import AnalyticComm, analytic_comm
    zero2 = AnalyticComm({"all_reduce": 1.0, "all_gather": 1.0}, "allreduce_and_scatter", 2.0, "ZeRO paper")
    out = analytic_comm(zero2, params=250, world=4, backend="nccl")   # Psi = 1000 bytes
    assert out["analytic_wire_bytes_per_rank"] == 2250.0            # (2 + 1) x 3/4 x 1000
    assert out["paper_wire_bytes_per_rank"] == 1500.0               # 2 x 3/4 x 1000
    assert out["analytic_payload_bytes"] == {"all_reduce": 1000.0, "all_gather": 1000.0}
    fsdp = AnalyticComm({"all_gather": 2.0, "reduce_scatter": 1.0}, "fully_shard", 3.0, "ZeRO paper")
    assert analytic_comm(fsdp, 250, 2, "gloo")["analytic_wire_bytes_per_rank"] == 2000.0
    assert analytic_comm(fsdp, 250, 2, "nccl")["analytic_wire_bytes_per_rank"] == 1500.0
    assert analytic_comm(None, 250, 2, "gloo")["analytic_wire_bytes_per_rank"] is None


def test_commbench_bandwidth_arithmetic():
    from ddlbench.commbench.command import bus_bandwidth, ceilings, expected_written, parse_args
    # 1 GB all-reduce in 0.5 s on 4 ranks: algbw 2 GB/s, busbw 2 x 2 x 3/4 = 3 GB/s
    assert bus_bandwidth("all_reduce", 1e9, 0.5, 4) == (2e9, 3e9)
    assert bus_bandwidth("all_gather", 1e9, 0.5, 4) == (2e9, 1.5e9)
    assert bus_bandwidth("broadcast", 1e9, 0.5, 4) == (2e9, 2e9)
    assert expected_written("send", 1000, 4, "gloo") == 250.0          # one sender of four
    assert expected_written("reduce_scatter", 1000, 2, "gloo") == 1000.0
    assert ceilings({"rows": [{"kind": "all_reduce", "busbw_Bps": 1.0}, {"kind": "all_reduce", "busbw_Bps": 3.0}]}) \
        == {"all_reduce": 3.0}
    opts = parse_args(["launcher.nproc=3", "sizes=[1024,4096]", "kinds=[all_reduce]"])
    assert (opts["nproc"], opts["sizes"], opts["kinds"]) == (3, [1024, 4096], ["all_reduce"])
    # per kind and size: the slowest rank's median, and its mean beside it
    from ddlbench.commbench.command import summarize
    ranks = [[{"kind": "send", "bytes": 8, "median_s": 1.0, "mean_s": 2.0, "written": None}],
             [{"kind": "send", "bytes": 8, "median_s": 1.5, "mean_s": 1.6, "written": None}]]
    (row,) = summarize(ranks, 2, "gloo")
    assert (row["time_s"], row["mean_time_s"], row["algbw_Bps"]) == (1.5, 2.0, 8 / 1.5)
    from ddlbench.commbench.command import default_sizes
    assert parse_args([])["sizes"] is None                  # chosen once the device is known
    assert max(default_sizes("cpu")) == 16 << 20            # gloo levels off by 16 MiB
    assert max(default_sizes("cuda")) == 1 << 30            # NVLink / InfiniBand need ~GiB messages
    from ddlbench.errors import ConfigError
    assert parse_args(["gap_ms=50"])["gap_ms"] == 50.0 and parse_args([])["gap_ms"] == 0.0
    for bad in (["kinds=[allreduce]"], ["launcher.nproc=1"], ["nproc"], ["colour=red"], ["gap_ms=-1"]):
        with pytest.raises(ConfigError):
            parse_args(bad)


def test_stragglers_from_host_time():
    from ddlbench.metrics.stragglers import describe, find_stragglers, lateness

    # 3 ranks, 3 steps; rank 2 is 0.05 s late in every step, rank 1 only once
    host = [[0.01, 0.02, 0.01], [0.01, 0.12, 0.01], [0.06, 0.07, 0.06]]
    assert [pytest.approx(r) for r in lateness(host)] == [[0, 0, 0], [0, 0.10, 0], [0.05, 0.05, 0.05]]
    found = find_stragglers(host, step_median_s=0.25)
    assert found["late_median_s"] == pytest.approx([0.0, 0.0, 0.05])
    assert found["late_fraction"] == pytest.approx([0.0, 0.0, 0.2])
    assert found["flagged"] == [2]
    assert describe(found) == ["straggler: rank 2 joins each step 50 ms after the fastest rank "
                               "(median; 20% of the step), so its peers wait for it"]
    assert find_stragglers(host, step_median_s=1.0)["flagged"] == []      # 5% < 10%
    with pytest.raises(ValueError):
        lateness([[0.1], [0.1, 0.2]])


def test_comm_by_group_size():
    from ddlbench.metrics.comm import group_wire_bytes
    c = CommCounter()
    c.add("all_reduce", 1000, group="4@2")
    c.add("all_reduce", 200, group="2@1")
    c.add("broadcast", 100)
    c.add("all_reduce", 300, calls=2, group="4@2")
    taken = c.take()
    assert taken["all_reduce"] == {"bytes": 1500, "calls": 4, "group_bytes": {"2@1": 200, "4@2": 1300},
                                   "group_calls": {"2@1": 1, "4@2": 3}}
    assert "group_bytes" not in taken["broadcast"] and "group_calls" not in taken["broadcast"]
    assert per_step(taken, 4)["all_reduce"]["group_bytes"] == {"2@1": 50.0, "4@2": 325.0}
    assert per_step(taken, 4)["all_reduce"]["group_calls"] == {"2@1": 0.25, "4@2": 0.75}
    assert c.take() == {}
    # 2 * 3/4 * 1000 + 2 * 1/2 * 200 ; a group of one sends nothing
    assert group_wire_bytes({"all_reduce": {"4@2": 1000, "2@1": 200, "1@1": 999}}) == 1700.0


def test_model_state_theory_comes_from_the_cost_model_by_hand():
    """model_state_bytes_per_rank_theory is the variant's cost model's parameters + gradients +
    optimizer state (stated once, as advise's estimate reads it): DDP fp32 AdamW 4 + 4 + 8 per
    parameter; without the bucket view the reducer's copy of the gradients is a buffer of the step,
    not model state; ZeRO-3 at 2 ranks halves all three."""
    from ddlbench.adapters.variant import model_state_theory
    from ddlbench.planning.config import plan_from_overrides

    def theory(*overrides, precision="fp32"):
        plan = plan_from_overrides(["launcher.nproc=2", *overrides])
        return model_state_theory(plan.variant, plan.dims, precision, 1000, "adamw")
    assert theory("framework=ddp") == 16_000
    assert theory("framework=ddp", "framework.options.gradient_as_bucket_view=false") == 16_000
    assert theory("framework=deepspeed_zero3") == 16_000 // 2
    # DeepSpeed's bf16 engine: 2-byte parameters and gradients, fp32 master + Adam (12), all halved
    assert theory("framework=deepspeed_zero3", precision="bf16") == (2 + 2 + 12) * 1000 // 2


def test_commbench_at_more_ranks_than_the_network_has_devices_keeps_its_fits(tmp_path, capsys):
    """4 ranks on bench cluster's two 1-core nodes (2 a node, --overcommit): the fits stay in
    commbench.json; no network.yaml is written (the description has 2 devices), said on stderr
    instead of failing the command after the measurement."""
    import yaml

    from ddlbench.commbench.command import _fitted_network_file
    base = tmp_path / "box.yaml"
    base.write_text(yaml.safe_dump({"name": "box", "dimensions": [
        {"name": "node", "size": 1, "bandwidth_GBps": 1.0, "latency_us": 100.0},
        {"name": "link", "size": 2, "bandwidth_GBps": 0.0125, "latency_us": 100.0}]}))
    fit = {"kind": "all_reduce", "world_size": 4, "alpha_s": 0.0, "bandwidth_Bps": 8e6, "sizes": [1, 2]}
    assert _fitted_network_file({"fits": [fit], "world_size": 4}, {"network": str(base)}, tmp_path) is None
    assert not (tmp_path / "network.yaml").exists() and "4 ranks exceed the 2 devices" in capsys.readouterr().err
    assert _fitted_network_file({"fits": [{**fit, "world_size": 2}], "world_size": 2}, {"network": str(base)},
                                tmp_path) == tmp_path / "network.yaml"


def test_window_against_median_step_by_hand():
    """One slow step in ten (a 20 ms step among 10 ms ones): the window's mean is 11 ms, the median
    10 ms, the spread (p90 - p10) / 2 about 0.5 ms: flagged; a steady window is not."""
    from ddlbench.metrics.timing import summarize, window_vs_median
    steps = [0.010] * 9 + [0.020]
    out = window_vs_median(sum(steps) / len(steps), summarize(steps))
    assert out["median_step_s"] == pytest.approx(0.010) and out["window_over_median"] == pytest.approx(1.1)
    assert out["spread_s"] == pytest.approx((summarize(steps)["p90"] - 0.010) / 2) and out["outlier"] is True
    steady = [0.010, 0.011, 0.009, 0.010, 0.0105, 0.0095]
    assert window_vs_median(sum(steady) / len(steady), summarize(steady))["outlier"] is False
    # with the step count: the slowest step alone moves the window's figure by (20 - 10) ms / 110 ms
    moved = window_vs_median(sum(steps) / len(steps), summarize(steps), len(steps))
    assert moved["window_s"] == pytest.approx(0.110) and moved["slowest_step_moves"] == pytest.approx(0.010 / 0.110)


def test_window_sized_by_time_by_hand():
    """run.min_window_s: 2 s of 0.15 s steps is ceil(13.33) = 14 steps; never fewer than
    run.measure_steps (20 here with 0.5 s steps: 4 would fill it); an exact fit is not rounded up
    by float error (1.0 s / 0.1 s = 10, not 11); a near-zero step is bounded. For one 0.25 s
    outlier (a full collection) to move the figure by under 1%, the window needs 25 s."""
    from ddlbench.metrics.window import MAX_STEPS, seconds_for_outlier, window_steps
    assert window_steps(10, None, None) == 10
    assert window_steps(10, 2.0, 0.15) == 14
    assert window_steps(20, 2.0, 0.5) == 20
    assert window_steps(3, 1.0, 0.1) == 10
    assert window_steps(3, 10.0, 1e-12) == MAX_STEPS
    with pytest.raises(ValueError, match="positive warm-up step"):
        window_steps(3, 1.0, 0.0)
    assert seconds_for_outlier(0.25) == pytest.approx(25.0)
    assert seconds_for_outlier(0.25, moves=0.05) == pytest.approx(5.0)


def test_a_window_sized_by_time_needs_a_warm_up_step_and_no_epochs():
    from ddlbench.planning.config import ConfigError, plan_from_overrides
    with pytest.raises(ConfigError, match="min_window_s needs run.warmup_steps >= 1"):
        plan_from_overrides(["run.min_window_s=5", "run.warmup_steps=0"])
    with pytest.raises(ConfigError, match="run.epochs .quality mode"):
        plan_from_overrides(["run.min_window_s=5", "run.epochs=1", "data=markov"])
    with pytest.raises(ConfigError, match="min_window_s"):
        plan_from_overrides(["run.min_window_s=0"])
    assert plan_from_overrides(["run.min_window_s=2.5"]).cfg.run.min_window_s == 2.5


def test_warm_up_ends_when_the_steps_settle_by_hand():
    """ddlbench/metrics/warmup.py on a series that settles late (the shape of the H200 per-expert loop's
    first steps): span 3, step 0 left out. After 10 steps: median(1.17, 0.87, 0.72) = 0.87 before,
    median(0.71, 0.72, 0.715) = 0.715 last, drift -17.8%; after 11: 0.72 before, 0.715 last, -0.7%: settled."""
    from ddlbench.metrics.warmup import drift, settled, warmup_end
    s = [5.0, 2.08, 1.52, 1.25, 1.17, 0.87, 0.72, 0.71, 0.72, 0.715, 0.71, 0.72, 0.71, 0.72, 0.71]
    assert drift(s[:6]) is None and not settled(s[:6])            # 5 steps after step 0: too few to judge
    assert drift(s[:7]) == pytest.approx(0.87 / 1.52 - 1)
    assert drift(s[:10]) == pytest.approx(0.715 / 0.87 - 1) and not settled(s[:10])
    assert drift(s[:11]) == pytest.approx(0.715 / 0.72 - 1) and settled(s[:11])
    assert warmup_end(s, 3, 14) == (11, "settled")
    assert warmup_end(s, 3, 9) == (9, "cap")            # never settled within the cap
    assert warmup_end(s, 12, 14) == (12, "settled")     # never fewer than run.warmup_steps
    assert warmup_end(s, 3, None) == (3, "fixed")
    flat = [3.0] + [0.5, 0.52, 0.49, 0.9, 0.5, 0.51, 0.5, 0.5]   # one slow step among three moves no median
    assert warmup_end(flat, 3, 8) == (7, "settled")
    with pytest.raises(ValueError, match="cannot say where"):
        warmup_end(s[:5], 3, 14)


def test_warm_up_until_settled_needs_a_throughput_run_and_a_cap_above_the_minimum():
    from ddlbench.planning.config import ConfigError, plan_from_overrides
    assert plan_from_overrides(["run.warmup_max_steps=20"]).cfg.run.warmup_max_steps == 20
    with pytest.raises(ConfigError, match="run.warmup_max_steps=3 needs 1 <= run.warmup_steps"):
        plan_from_overrides(["run.warmup_max_steps=3"])
    with pytest.raises(ConfigError, match="run.warmup_max_steps=5 needs 1 <= run.warmup_steps"):
        plan_from_overrides(["run.warmup_max_steps=5", "run.warmup_steps=0"])
    with pytest.raises(ConfigError, match="quality mode"):
        plan_from_overrides(["run.warmup_max_steps=20", "run.epochs=1", "data=markov"])
