"""The network model, projection and bandwidth allocation against hand-computed values, the
`bench project` command, and predicted vs measured step times on this machine."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import bench, run_record

from ddlbench.network import model as m
from ddlbench.project.allocate import allocate, closed_form_split
from ddlbench.project.projection import compute_seconds, project, spans_for
from ddlbench.project.workload import Collective, Workload, from_record, scope_of

D1 = m.Dimension("nvlink", 8, 100e9, 1e-6, 1.0)
D2 = m.Dimension("nic", 4, 10e9, 1e-5, 4.0)
NET = m.Network("two", (D1, D2))


def test_single_dimension_costs():
    assert m.ring_allreduce(1e6, 4, 1e-6, 1e9) == pytest.approx(6e-6 + 1.5e-3)
    assert m.tree_allreduce(1e6, 4, 1e-6, 1e9) == pytest.approx(4e-6 + 2e-3)
    assert m.ring_gather(1e6, 4, 1e-6, 1e9) == pytest.approx(3e-6 + 0.75e-3)
    assert m.broadcast(1e6, 5, 1e-6, 1e9) == pytest.approx(3e-6 + 1e-3)     # ceil(log2 5) = 3
    assert m.p2p(1e6, 1e-6, 1e9) == pytest.approx(1e-6 + 1e-3)
    assert m.ring_allreduce(1e6, 1, 1e-6, 1e9) == 0.0


def test_layout_fills_the_innermost_dimension_first():
    assert m.layout(NET, 1) == [1, 1]
    assert m.layout(NET, 8) == [8, 1]
    assert m.layout(NET, 9) == [8, 2]          # whole units: 9 devices occupy 2 nodes
    assert m.layout(NET, 32) == [8, 4]
    with pytest.raises(ValueError):
        m.layout(NET, 33)


def test_hierarchical_and_flat_all_reduce_over_two_dimensions():
    spans = [(8, D1), (4, D2)]
    # dim 1: 2 [7 us + 7/8 * 8e6 / 100e9]; dim 2 on 1e6 bytes: 2 [3 * 10 us + 3/4 * 1e6 / 10e9]
    hier = 2 * (7e-6 + 7e-5) + 2 * (3e-5 + 7.5e-5)
    assert m.hierarchical("all_reduce", 8e6, spans) == pytest.approx(hier)
    ring = 2 * 31 * 1e-5 + 2 * 31 / 32 * 8e6 / 10e9      # slowest link, highest latency
    assert m.flat("all_reduce", "ring", 8e6, spans) == pytest.approx(ring)
    assert m.collective_time("all_reduce", 8e6, spans) == (pytest.approx(hier), "hierarchical")
    assert m.collective_time("all_reduce", 8e6, spans, "ring") == (pytest.approx(ring), "ring")
    assert m.collective_time("send", 1e6, spans) == (pytest.approx(1e-5 + 1e-4), "p2p")


def test_scopes_of_measured_groups_and_their_spans():
    assert scope_of("4@1", 4) == "world" and scope_of("2@1", 4) == "node" and scope_of("2@2", 4) == "across"
    assert scope_of("1@1", 2) is None
    assert spans_for("world", NET, 32) == [(8, D1), (4, D2)]
    assert spans_for("node", NET, 32) == [(8, D1)]
    assert spans_for("across", NET, 32) == [(1, D1), (4, D2)]


WORK = Workload("ddp", world=2, per_device_batch=4, step_s=0.1011,
                collectives=(Collective("all_reduce", 1e6, "world", 2),))
FLAT = m.Network("flat", (m.Dimension("host", 64, 1e9, 0.0),))


def test_projection_weak_and_strong_by_hand():
    rows = project(WORK, FLAT, [2, 4], compute_s=0.1)
    # 2 devices: ring 2 * 1/2 * 1e6 / 1e9 = 1 ms (tree: 2 ms)
    assert rows[0]["comm_s"] == pytest.approx(1e-3) and rows[0]["step_s"] == pytest.approx(0.101)
    assert rows[0]["samples_per_s"] == pytest.approx(8 / 0.101)
    assert rows[0]["scaling_efficiency"] == pytest.approx(0.1 / 0.101)
    assert rows[1]["comm_s"] == pytest.approx(1.5e-3) and rows[1]["global_batch"] == 16
    strong = project(WORK, FLAT, [4], compute_s=0.1, scaling="strong", overlap=0.5)[0]
    assert strong["per_device_batch"] == 2 and strong["compute_s"] == pytest.approx(0.05)
    assert strong["step_s"] == pytest.approx(0.05 + 0.5 * 1.5e-3)
    # compute = measured step - modelled comm on the measured network
    assert compute_seconds(WORK, FLAT)[0] == pytest.approx(0.1011 - 1e-3)


def test_allocation_matches_the_closed_form():
    """One world all-reduce, hierarchical, no latency: dimension i carries D_i bytes;
    min sum D_i / bw_i under sum c_i bw_i = budget has bw_i ~ sqrt(D_i / c_i)."""
    net = m.Network("z", (m.Dimension("a", 8, 50e9, 0.0, 1.0), m.Dimension("b", 4, 50e9, 0.0, 4.0)))
    work = Workload("ddp", 32, 1, 1.0, (Collective("all_reduce", 8e6, "world", 32),))
    carried = [2 * 7 / 8 * 8e6, 2 * 3 / 4 * 1e6]
    for kwargs, costs, budget in (({"budget_GBps": 100.0}, [1, 1], 100.0), ({"budget_cost": 100.0}, [1, 4], 100.0)):
        got = allocate(work, net, 32, compute_s=0.01, objective="time", **kwargs)
        want = closed_form_split(carried, costs, budget)
        assert got["converged"], got["message"]
        assert got["bandwidth_GBps"] == pytest.approx(want, rel=0.01)
    ppc = allocate(work, net, 32, compute_s=0.01, objective="perf_per_cost", min_GBps=1, max_GBps=400)
    assert ppc["converged"] and ppc["cost"] < ppc["cost_current"]


def test_data_parallel_only_and_ok_only():
    from ddlbench.errors import ConfigError
    with pytest.raises(ConfigError, match="data-parallel"):
        from_record({"status": "ok", "parallel": {"world_size": 4, "tp": 2, "pp": 1}})
    with pytest.raises(ConfigError, match="failed"):
        from_record({"status": "failed", "run_id": "x"})


@pytest.mark.parametrize("args,needle", [
    (["network=nope"], "unknown network"),
    # issue 66: a path that is no network file said "known: " with an empty list
    (["network=/etc/passwd"], "not a network description"),
    (["network=/nonexistent/net"], "no such network file (a path to a .yaml file like conf/network/*.yaml, or one of: "),
    (["network=dgx_a100_fat_tree", "world_sizes=[8,1000000]"], "exceed network"),
    (["network=dgx_a100_fat_tree", "colour=blue"], "unknown option"),
    (["network=dgx_a100_fat_tree", "overlap=2"], "overlap"),
    (["network=dgx_a100_fat_tree", "allocate=time"], "exactly one of"),
])
def test_bad_project_arguments_exit_2(tmp_path, args, needle):
    run_dir = _ddp2(tmp_path)
    proc = bench("project", str(run_dir), *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


_RUNS: dict = {}


def _ddp2(tmp_path_factory_or_path) -> Path:
    if "ddp2" not in _RUNS:
        d = tmp_path_factory_or_path / "ddp2"
        proc, rec = run_record(d, "launcher.nproc=2", "run.warmup_steps=1", "run.measure_steps=4")
        assert rec["status"] == "ok"
        _RUNS["ddp2"] = d
    return _RUNS["ddp2"]


def test_bench_project_writes_table_json_csv_and_plot(tmp_path):
    run_dir = _ddp2(tmp_path)
    proc = bench("project", str(run_dir), "network=dgx_a100_fat_tree", "world_sizes=[8,512,100000]",
                 "allocate=time", "budget_GBps=200", f"out={tmp_path / 'p'}")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "p" / "projection.json").read_text())
    assert [r["devices"] for r in doc["rows"]] == [8, 512, 100000]
    rec = json.loads((run_dir / "result.json").read_text())
    # DDP all-reduces every fp32 gradient once a step: 4 bytes per parameter, as the run counted
    assert rec["comm"]["per_step_bytes"] == {"all_reduce": 4 * rec["model"]["params"]}
    assert doc["collectives"] == [{"kind": "all_reduce", "bytes_per_step": 4 * rec["model"]["params"],
                                   "scope": "world", "measured_group": 2}]
    assert all(0 < r["scaling_efficiency"] <= 1 for r in doc["rows"])
    assert doc["rows"][-1]["comm_s"] > doc["rows"][0]["comm_s"]
    assert sum(doc["allocation"]["bandwidth_GBps"]) == pytest.approx(200, rel=1e-3)
    assert (tmp_path / "p" / "projection.png").stat().st_size > 10_000
    assert "100000" in proc.stdout and "allocation (time" in proc.stdout and "exposed ms" in proc.stdout
    header = (tmp_path / "p" / "projection.csv").read_text().splitlines()[0]
    assert header.endswith(",scaling_efficiency,exposed_comm_s")        # columns only ever appended
    assert all(r["exposed_comm_s"] == pytest.approx(r["comm_s"]) for r in doc["rows"])   # DDP: no issue profile


@pytest.mark.slow
def test_predicted_vs_measured_step_time_on_this_machine_is_in_the_report(tmp_path):
    """DDP at 1 and 2 ranks, one thread per rank: the report's projection check predicts the
    2-rank step from the 1-rank compute and the 2-rank run's all-reduce on local_gloo. How close
    it comes depends on the machine and what else runs on it (-3.8% and -7.2% alone on this VM,
    2026-11-23; -47.6% and -81% in full-suite runs on a busy VM): the accuracy is what
    benchmarks/comm_strategies.py prints, never a bound here (tests/conftest.py). What must hold on
    every machine: the prediction is the measured compute plus the priced exposed comm, its error is
    against the 2-rank run's own step, and the report shows that error."""
    from ddlbench.network.model import load
    from ddlbench.project.validate import predict
    common = ("run.warmup_steps=2", "run.measure_steps=8", "launcher.threads_per_rank=1")
    _, one = run_record(tmp_path / "n1", "launcher.nproc=1", "run.global_batch=4", *common)
    _, two = run_record(tmp_path / "n2", "launcher.nproc=2", "run.global_batch=8", *common)
    p = predict(two, one, load("local_gloo"))
    print(f"predicted {p['predicted_step_s'] * 1e3:.1f} ms, measured {p['measured_step_s'] * 1e3:.1f} ms, "
          f"error {p['relative_error']:+.1%}")
    assert p["comm_s"] > 0 and p["compute_s"] == pytest.approx(one["timing"]["step_time_s"]["median"])
    assert 0 < p["exposed_comm_s"] <= p["comm_s"]
    assert p["predicted_step_s"] == pytest.approx(p["compute_s"] + p["exposed_comm_s"])
    assert p["measured_step_s"] == pytest.approx(two["timing"]["step_time_s"]["median"])
    assert p["relative_error"] == pytest.approx(p["predicted_step_s"] / p["measured_step_s"] - 1)
    out = bench("report", str(tmp_path), "-o", str(tmp_path / "rep"))
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Projection check" in md and f"{p['relative_error']:+.1%}" in md


def test_alpha_beta_fit_in_the_models_terms():
    """Hand-computed: a ring all-reduce over 4 ranks costs 6 alpha + 1.5 B / bw; with alpha = 50 us
    and bw = 2 GB/s, 1 MB takes 0.3 + 0.75 = 1.05 ms and 4 MB 0.3 + 3 = 3.3 ms."""
    from ddlbench.network.fit import coefficients, fit_alpha_beta, fits, fitted_network
    assert coefficients("all_reduce", 4) == (6, 1.5) and coefficients("all_gather", 4) == (3, 0.75)
    assert coefficients("broadcast", 5) == (3, 1.0) and coefficients("send", 2) == (1, 1.0)
    f = fit_alpha_beta([(1e6, 1.05e-3), (4e6, 3.3e-3)], "all_reduce", 4)
    assert f["alpha_s"] == pytest.approx(50e-6) and f["bandwidth_Bps"] == pytest.approx(2e9)
    # a negative intercept (noise) is refitted through the origin: all-gather, 2 ranks, 0.5 B / bw
    f = fit_alpha_beta([(1e6, 0.4e-3), (2e6, 1.0e-3)], "all_gather", 2)
    assert f["alpha_s"] == 0.0
    assert f["bandwidth_Bps"] == pytest.approx(0.5 / ((1e6 * 0.4e-3 + 2e6 * 1.0e-3) / (1e12 + 4e12)))
    with pytest.raises(ValueError, match="two message sizes"):
        fit_alpha_beta([(1e6, 1e-3)], "all_reduce", 2)
    rows = [{"kind": "all_reduce", "bytes": 1e6, "time_s": 2e-4 + 1e6 / 1e8},
            {"kind": "all_reduce", "bytes": 1e7, "time_s": 2e-4 + 1e7 / 1e8},
            {"kind": "send", "bytes": 1e6, "time_s": 1e-2}]            # one size: no fit
    (ar,) = fits(rows, 2)
    flat = [{"kind": "broadcast", "bytes": b, "time_s": t} for b, t in ((1e6, 2e-3), (2e6, 1e-3))]   # said, not raised
    assert fits(flat, 2) == [{"kind": "broadcast", "world_size": 2,
                              "error": "broadcast: time does not grow with size; no bandwidth to fit"}]
    assert ar["alpha_s"] == pytest.approx(100e-6) and ar["bandwidth_Bps"] == pytest.approx(1e8)
    # fitted on the mean instead: an op that stalls 4 ms one time in four adds 1 ms to it
    means = [dict(r, mean_time_s=r["time_s"] + 1e-3) for r in rows]
    (am,) = fits(means, 2, statistic="mean_time_s")
    assert am["alpha_s"] == pytest.approx((2e-4 + 1e-3) / 2) and am["bandwidth_Bps"] == pytest.approx(1e8)
    # the cluster's description: one rank per node, so the link dimension is what was measured
    cluster = {"name": "cluster_box", "dimensions": [
        {"name": "node", "size": 1, "bandwidth_GBps": 1.0, "latency_us": 100.0},
        {"name": "link", "size": 2, "bandwidth_GBps": 0.0125, "latency_us": 100.0}]}
    fitted = fitted_network(cluster, ar, 2)
    assert fitted["dimensions"][1]["bandwidth_GBps"] == pytest.approx(0.1) and fitted["dimensions"][1]["latency_us"] == 100.0
    assert fitted["dimensions"][0] == cluster["dimensions"][0] and fitted["name"] == "cluster_box_fitted"
    from ddlbench.network.model import from_dict
    assert from_dict(fitted).dims[1].bandwidth == pytest.approx(1e8)


def test_each_collective_kind_is_priced_by_its_own_fit():
    """gloo's reduce-scatter moves as much as an all-reduce: on the cluster's 100 Mbit/s link
    commbench fits all-reduce at 12.0 MB/s and reduce-scatter at 6.0 MB/s in the ring model's
    terms. The fitted network keeps the second under `kinds`, and the model prices a 2-rank
    reduce-scatter of 6 MB at (1/2 x 6 MB) / 6 MB/s = 0.5 s (the ring model at the link's
    12 MB/s: 0.25 s); every other kind stays on the link's fit."""
    from ddlbench.network.fit import fitted_network
    from ddlbench.network.model import collective_time, from_dict, kind_spans
    from ddlbench.project.projection import spans_for
    cluster = {"name": "cluster_box", "dimensions": [
        {"name": "node", "size": 1, "bandwidth_GBps": 1.0, "latency_us": 100.0},
        {"name": "link", "size": 2, "bandwidth_GBps": 0.0125, "latency_us": 100.0}]}
    ar = {"kind": "all_reduce", "world_size": 2, "alpha_s": 0.0, "bandwidth_Bps": 12e6, "sizes": [1, 2]}
    rs = {"kind": "reduce_scatter", "world_size": 2, "alpha_s": 0.0, "bandwidth_Bps": 6e6, "sizes": [1, 2]}
    bad = {"kind": "broadcast", "world_size": 2, "error": "no fit"}
    fitted = fitted_network(cluster, ar, 2, [ar, rs, bad])
    assert fitted["kinds"] == {"reduce_scatter": {"link": {"bandwidth_GBps": 0.006, "latency_us": 0.0}}}
    net = from_dict(fitted)
    spans = spans_for("world", net, 2)
    t_rs, _ = collective_time("reduce_scatter", 6e6, kind_spans(net, "reduce_scatter", spans), "ring")
    t_ag, _ = collective_time("all_gather", 6e6, kind_spans(net, "all_gather", spans), "ring")
    assert t_rs == pytest.approx(0.5) and t_ag == pytest.approx(0.25)
    assert kind_spans(net, "all_gather", spans) == spans
    assert "kinds" not in fitted_network(cluster, ar, 2)


def test_a_run_is_priced_by_the_algorithm_its_backend_runs():
    """4 ranks on 2 nodes (2 each), 1.8 MB all-reduced, link 12.5 MB/s, node 1 GB/s, no latency.
    gloo runs one flat ring across the link: 2 (4-1)/4 x 1.8 MB / 12.5 MB/s = 216 ms. A hierarchy
    (NCCL may pick one) reduce-scatters inside the node first: 2 x 1/2 x 0.9 MB / 12.5 MB/s = 72 ms
    on the link + 2 x 1/2 x 1.8 MB / 1 GB/s = 1.8 ms in the node."""
    from ddlbench.network.model import Dimension, backend_algorithm, collective_time
    assert backend_algorithm("gloo") == "gloo" and backend_algorithm("nccl") == "best"
    assert backend_algorithm(None) == "best"
    spans = [(2, Dimension("node", 2, 1e9, 0.0)), (2, Dimension("link", 2, 12.5e6, 0.0))]
    ring, alg = collective_time("all_reduce", 1.8e6, spans, backend_algorithm("gloo"))
    assert alg == "gloo" and ring == pytest.approx(0.216)
    best, alg = collective_time("all_reduce", 1.8e6, spans, backend_algorithm("nccl"))
    assert alg == "hierarchical" and best == pytest.approx(0.072 + 0.0018)


def test_gloo_reduce_scatter_is_priced_and_fitted_as_the_all_reduce_it_runs():
    """ProcessGroupGloo all-reduces a reduce-scatter's whole input: at 2 ranks each sends the full
    1.8 MB, not half. On a 12.5 MB/s link: 1.8 MB / 12.5 MB/s = 144 ms (the ring model: 72 ms).
    commbench's fit of such a reduce-scatter, in the same terms, gives the link's rate back."""
    from ddlbench.network.fit import coefficients, fit_alpha_beta
    spans = [(1, m.Dimension("node", 1, 1e9, 0.0)), (2, m.Dimension("link", 2, 12.5e6, 0.0))]
    assert m.collective_time("reduce_scatter", 1.8e6, spans, "gloo") == (pytest.approx(0.144), "gloo")
    assert m.collective_time("reduce_scatter", 1.8e6, spans, "ring")[0] == pytest.approx(0.072)
    assert m.collective_time("all_gather", 1.8e6, spans, "gloo")[0] == pytest.approx(0.072)
    assert coefficients("reduce_scatter", 4, "gloo") == coefficients("all_reduce", 4) == (6, 1.5)
    assert coefficients("reduce_scatter", 4) == (3, 0.75)
    f = fit_alpha_beta([(1e6, 1e6 / 12.5e6), (4e6, 4e6 / 12.5e6)], "reduce_scatter", 2, "gloo")
    assert f["bandwidth_Bps"] == pytest.approx(12.5e6) and f["backend"] == "gloo"


def test_a_fit_per_size_segment_prices_each_message_on_its_own_side_of_a_non_linearity():
    """All-gather at 2 ranks, alpha 1 ms, 12.5 MB/s (0.5 B / 12.5 MB/s a byte): 250 kB in 11 ms and
    1 MB in 41 ms on the line, but 4 MB in 250 ms (the line says 161 ms; the emulated 100 Mbit/s
    link's 4 MiB all-gather is 1.45x its line). Segment 1 (up to 1 MB) is that line exactly:
    alpha 1 ms, 12.5 MB/s. Segment 2's line has a negative intercept, so it goes through the origin.
    A 600 kB message is priced on segment 1: 1 ms + 0.5 x 600 kB / 12.5 MB/s = 25 ms; over 4 ranks a
    1.2 MB message moves 300 kB a step (600 kB at 2 ranks), so segment 1 too: 3 alpha + 0.75 x 1.2 MB
    / 12.5 MB/s = 75 ms."""
    from ddlbench.network.fit import fit_alpha_beta, fitted_network
    pts = [(250e3, 0.011), (1e6, 0.041), (4e6, 0.25)]
    f = fit_alpha_beta(pts, "all_gather", 2)
    s1, s2 = f["segments"]
    assert s1["up_to_bytes"] == 1_000_000 and s2["up_to_bytes"] is None
    assert s1["alpha_s"] == pytest.approx(1e-3) and s1["bandwidth_Bps"] == pytest.approx(12.5e6)
    assert s2["alpha_s"] == 0.0 and s2["bandwidth_Bps"] == pytest.approx(0.5 / ((1e6 * 0.041 + 4e6 * 0.25) / 17e12))
    cluster = {"name": "box", "dimensions": [      # one core per node: 2 ranks span the link
        {"name": "node", "size": 1, "bandwidth_GBps": 1.0, "latency_us": 0.0},
        {"name": "link", "size": 2, "bandwidth_GBps": 0.0125, "latency_us": 100.0}]}
    ar = {"kind": "all_reduce", "world_size": 2, "alpha_s": 0.0, "bandwidth_Bps": 12.5e6, "sizes": [1, 2]}
    net = m.from_dict(fitted_network(cluster, ar, 2, [ar, f]))
    two = [(1, net.dims[0]), (2, net.dims[1])]
    four = [(2, net.dims[0]), (2, net.dims[1])]

    def price(b, spans, sized=True):
        return m.collective_time("all_gather", b, m.kind_spans(net, "all_gather", spans, b if sized else None),
                                 "gloo")[0]
    assert price(600e3, two) == pytest.approx(0.025)
    assert price(1.2e6, four) == pytest.approx(0.075)
    assert price(3e6, two) == pytest.approx(0.5 * 3e6 / s2["bandwidth_Bps"])
    whole = price(600e3, two, sized=False)           # the one line through all three sizes
    assert whole == pytest.approx(f["alpha_s"] + 0.5 * 600e3 / f["bandwidth_Bps"]) and whole / 0.025 > 1.2
    assert m.kind_spans(net, "broadcast", two, 600e3) == two      # no fit of its own: as described


def test_each_message_of_a_step_is_priced_once_with_its_latency():
    """FSDP on 2 nodes x 1 rank counted at the c10d dispatch: 3.6 MB all-gathered in 6 calls and
    1.8 MB reduce-scattered in 3 per step. On the link (12.5 MB/s, 100 us) with gloo's algorithm:
    6 x (100 us + 0.5 x 600 kB / 12.5 MB/s) + 3 x (2 x 100 us + 1.0 x 600 kB / 12.5 MB/s)
    = 6 x 24.1 ms + 3 x 48.2 ms = 289.2 ms. Calls per group when recorded; an adapter's own counter
    (Horovod's requests, fused into buffers) is one message."""
    from ddlbench.project.projection import comm_time
    from ddlbench.project.workload import messages
    comm = {"source": "c10d_dispatch", "per_step_bytes": {"all_gather": 3.6e6, "reduce_scatter": 1.8e6},
            "per_step_calls": {"all_gather": 6.0, "reduce_scatter": 3.0},
            "per_step_bytes_by_group": {"all_gather": {"2@2": 3.6e6}, "reduce_scatter": {"2@2": 1.8e6}}}
    rec = {"status": "ok", "parallel": {"world_size": 2, "global_batch": 16, "nodes": 2},
           "timing": {"step_time_s": {"median": 0.34}}, "framework": {"name": "fsdp"}, "comm": comm}
    work = from_record(rec)
    assert [(c.kind, c.calls, c.nodes) for c in work.collectives] == [("all_gather", 6.0, 2), ("reduce_scatter", 3.0, 2)]
    net = m.from_dict({"name": "box", "dimensions": [
        {"name": "node", "size": 1, "bandwidth_GBps": 1.0, "latency_us": 100.0},
        {"name": "link", "size": 2, "bandwidth_GBps": 0.0125, "latency_us": 100.0}]})
    total, parts = comm_time(work, net, 2, "gloo", measured_groups=True)
    assert total == pytest.approx(6 * 0.0241 + 3 * 0.0482)
    assert parts == {"all_gather/world (gloo)": pytest.approx(0.1446), "reduce_scatter/world (gloo)": pytest.approx(0.1446)}
    assert messages({**comm, "per_step_calls_by_group": {"all_gather": {"2@2": 2.0}}}) == {"all_gather": {"2@2": 2.0}}
    # a message every other step (DASO's cross-node average at global_skip 2): half a call a step,
    # priced as one message of twice the per-step bytes, half the time
    assert messages({**comm, "per_step_calls_by_group": {"all_reduce": {"2@2": 0.5}}}) == {"all_reduce": {"2@2": 0.5}}
    hvd = {"source": "adapter", "per_step_bytes": {"all_reduce": 1.8e6}, "per_step_calls": {"all_reduce": 28.0}}
    assert messages(hvd) == {}
    assert from_record({**rec, "comm": hvd}).collectives[0].calls == 1.0


def test_messages_handed_over_during_backward_are_drained_under_it():
    """A link drains messages in issue order as they come (a work-conserving queue). By hand,
    a 10 ms collective in two equal halves: issued 6 ms before compute ends, then at its end:
    the first half crosses from -6 to -1 ms, the second from 0 to 5 ms: a 5 ms wait. Issued 12 and
    2 ms before: the first half done at -7, the second crosses -2..3: 3 ms. All at the end: 10 ms.
    A 100 ms collective whose first message goes 30 ms early: 70 ms."""
    from ddlbench.project.projection import drained
    assert drained(0.010, [(0.006, 50), (0.0, 50)]) == pytest.approx(0.005)
    assert drained(0.010, [(0.002, 50), (0.012, 50)]) == pytest.approx(0.003)   # order by headroom
    assert drained(0.010, [(0.0, 100)]) == pytest.approx(0.010)
    assert drained(0.100, [(0.030, 10), (0.020, 80), (0.0, 10)]) == pytest.approx(0.070)
    assert drained(0.004, [(0.030, 10), (0.020, 80), (0.0, 10)]) == pytest.approx(0.0004)   # the last tenth
    assert drained(0.010, []) == 0.010


def test_a_horovod_issue_profile_prices_its_overlap_in_projection():
    """Horovod's record with `comm.issued` (headroom, bytes): the projection exposes only what the
    link has not drained when compute ends; compute from the measured run subtracts the same."""
    from ddlbench.project.projection import comm_time, exposed_time
    comm = {"source": "adapter", "per_step_bytes": {"all_reduce": 1e6}, "per_step_calls": {"all_reduce": 2.0},
            "issued": {"all_reduce": [[0.020, 5e5], [0.0, 5e5]]}}
    rec = {"status": "ok", "parallel": {"world_size": 2, "global_batch": 8, "nodes": 1},
           "timing": {"step_time_s": {"median": 0.1}}, "framework": {"name": "horovod"}, "comm": comm}
    work = from_record(rec)
    assert work.collectives[0].issued == ((0.020, 5e5), (0.0, 5e5))
    slow = m.Network("slow", (m.Dimension("host", 64, 1e7, 0.0),))   # 10 MB/s: ring 2 x 1/2 x 1 MB = 100 ms
    assert comm_time(work, slow, 2, "ring")[0] == pytest.approx(0.1)
    assert exposed_time(work, slow, 2, "ring") == pytest.approx(0.080)          # max(100 - 20, 50 - 0)
    assert exposed_time(work, FLAT, 2, "ring") == pytest.approx(0.5e-3)        # 1 ms: only its last half
    assert compute_seconds(work, slow, algorithm="ring")[0] == pytest.approx(0.020)
    row = project(work, slow, [2], compute_s=0.02, algorithm="ring")[0]
    assert row["step_s"] == pytest.approx(0.1) and row["exposed_comm_s"] == pytest.approx(0.08)
    strong = project(work, slow, [4], compute_s=0.02, scaling="strong", algorithm="ring")[0]
    # 4 devices, half the per-device batch: headroom halves (10 ms); ring 2 x 3/4 x 1 MB = 150 ms
    assert strong["exposed_comm_s"] == pytest.approx(0.140)
    without = from_record({**rec, "comm": {k: v for k, v in comm.items() if k != "issued"}})
    assert exposed_time(without, slow, 2, "ring") == pytest.approx(0.1)


def test_the_issue_log_gives_headroom_and_ranks_agree_on_the_latest():
    from ddlbench.metrics.comm import IssueLog, latest_issue, per_step
    log = IssueLog()
    log.add("all_reduce", 100, t=1.0)
    log.add("all_reduce", 50, t=1.5)
    log.compute_end(t=2.0)
    log.add("all_reduce", 7, t=2.5)          # after compute ended (synchronize's own): headroom 0
    log.step_end()
    log.add("all_reduce", 9, t=3.0)          # the next step's, not closed: not taken
    assert log.take() == {"all_reduce": [[1.0, 100], [0.5, 50], [0.0, 7]]}
    assert log.take() == {}
    assert latest_issue([[[1.0, 100], [0.5, 50]], [[0.8, 100], [0.6, 50]]]) == [[0.8, 100], [0.5, 50]]
    assert latest_issue([[[1.0, 100]], [[0.8, 60], [0.1, 40]]]) == [[1.0, 100]]
    row = per_step({"all_reduce": {"bytes": 300, "calls": 4, "issued": [[1.0, 150]]}}, steps=2)
    assert row == {"all_reduce": {"bytes": 150.0, "calls": 2.0, "issued": [[1.0, 150]]}}


def test_fits_measured_at_another_world_size_price_collectives_of_that_size():
    """commbench at 2 ranks (one a node) and at 4 (two a node, sharing its core and link): the
    fitted network keeps the 4-rank fits per kind under by_world, and a 4-rank collective is priced
    by them, a 2-rank one as before. By hand, gloo's flat ring, no latency: 2 ranks, 6 MB all-reduce
    over the 12 MB/s fit: 2 x 1/2 x 6 MB / 12 MB/s = 0.5 s; 4 ranks over the 4-rank fit (8 MB/s):
    2 x 3/4 x 6 MB / 8 MB/s = 1.125 s (the 2-rank fit would say 0.75 s)."""
    from ddlbench.network.fit import add_world_fits, fitted_network
    from ddlbench.network.model import collective_time, from_dict, kind_spans
    cluster = {"name": "cluster_box", "dimensions": [
        {"name": "node", "size": 1, "bandwidth_GBps": 1.0, "latency_us": 0.0},
        {"name": "link", "size": 2, "bandwidth_GBps": 0.0125, "latency_us": 0.0}]}
    ar2 = {"kind": "all_reduce", "world_size": 2, "alpha_s": 0.0, "bandwidth_Bps": 12e6, "sizes": [1, 2]}
    ar4 = {**ar2, "world_size": 4, "bandwidth_Bps": 8e6}
    rs4 = {"kind": "reduce_scatter", "world_size": 4, "error": "no fit"}
    doc = add_world_fits(fitted_network(cluster, ar2, 2), [ar4, rs4, ar2], 4)
    assert doc["kinds"] == {"all_reduce": {"link": {"bandwidth_GBps": 0.012, "latency_us": 0.0,
                                                     "by_world": {4: {"bandwidth_GBps": 0.008, "latency_us": 0.0}}}}}
    net = from_dict(doc)
    two = [(1, net.dims[0]), (2, net.dims[1])]
    four = [(2, net.dims[0]), (2, net.dims[1])]
    assert collective_time("all_reduce", 6e6, kind_spans(net, "all_reduce", two, 6e6), "gloo")[0] == pytest.approx(0.5)
    assert collective_time("all_reduce", 6e6, kind_spans(net, "all_reduce", four, 6e6), "gloo")[0] == pytest.approx(1.125)
    assert kind_spans(net, "all_gather", four, 6e6) == four          # no fit of its own: as described
    with pytest.raises(ValueError):
        add_world_fits(doc, [ar4], 4, dimension="rack")


def test_a_flat_ring_gets_a_shared_links_whole_rate():
    """bench cluster's node uplink is one link shared by the node's devices (`shared`, bandwidth
    stated per device): a flat ring in block order sends one flow through it, at the whole link;
    the hierarchical algorithm loads it from every device at once, at the share."""
    node = m.Dimension("node", 2, 50e6, 0.0)
    shared = m.Dimension("link", 2, 6.25e6, 0.0, 1.0, shared=True)
    b = 4 << 20
    # ring over 4: 2 x 3/4 x b at min(50 MB/s, 2 x 6.25 MB/s) = 12.5 MB/s
    assert m.flat("all_reduce", "ring", b, [(2, node), (2, shared)]) == pytest.approx(1.5 * b / 12.5e6)
    unshared = m.Dimension("link", 2, 6.25e6, 0.0, 1.0)
    assert m.flat("all_reduce", "ring", b, [(2, node), (2, unshared)]) == pytest.approx(1.5 * b / 6.25e6)
    # hierarchical: 2 x 1/2 x b at 50 MB/s, then 2 x 1/2 x b/2 at the 6.25 MB/s share
    assert m.hierarchical("all_reduce", b, [(2, node), (2, shared)]) == pytest.approx(b / 50e6 + b / 2 / 6.25e6)
    # the shared link's traffic also crosses the device's own link: a slow one (5 MB/s) paces it
    slow = m.Dimension("node", 2, 5e6, 0.0)
    assert m.hierarchical("all_reduce", b, [(2, slow), (2, shared)]) == pytest.approx(b / 5e6 + b / 2 / 5e6)
    assert m.from_dict({"dimensions": [{"name": "link", "size": 2, "bandwidth_GBps": 1, "latency_us": 0,
                                        "shared": True}]}).dims[0].shared


def test_a_hierarchy_made_of_gloos_collectives_pays_its_reduce_scatter_as_an_all_reduce():
    node, link = m.Dimension("node", 2, 50e6, 0.0), m.Dimension("link", 2, 10e6, 0.0)
    b = 1e6
    # node: all-reduce of b (2 x 1/2 x b) + all-gather (1/2 x b) at 50 MB/s; across: an all-reduce of b/2 at 10 MB/s
    assert m.hierarchical("all_reduce", b, [(2, node), (2, link)], gloo=True) == pytest.approx(
        1.5 * b / 50e6 + (b / 2) / 10e6)


def test_bandwidth_split_rates_by_hand():
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bandwidth_split import split_rates
    assert split_rates(300, 0.5) == (150, 300)      # the uplink carries both devices' 150 Mbit/s shares
    assert split_rates(300, 2 / 3) == pytest.approx((200, 200))
    with pytest.raises(ValueError):
        split_rates(300, 1.0)


def test_perf_per_cost_with_a_device_price_has_the_closed_form_optimum():
    """One dimension, a ring all-reduce of B over 4 devices, no latency: step = c + k / bw with
    k = 2 x 3/4 x B; minimising step x (D + a bw) gives bw = sqrt(k D / (c a)). Without a device
    price the optimum is the lower bound (the product only falls with the bandwidth)."""
    import math
    net = m.Network("one", (m.Dimension("host", 4, 1e9, 0.0, 2.0),))
    b, c, a, dev = 8e6, 0.01, 2.0, 3.0
    work = Workload("ddp", 4, 1, 1.0, (Collective("all_reduce", b, "world", 4),))
    got = allocate(work, net, 4, compute_s=c, objective="perf_per_cost", min_GBps=0.01, max_GBps=100,
                   algorithm="ring", device_cost=dev)
    k = 2 * 3 / 4 * b / 1e9          # seconds x GB/s
    assert got["converged"] and got["bandwidth_GBps"][0] == pytest.approx(math.sqrt(k * dev / (c * a)), rel=0.01)
    free = allocate(work, net, 4, compute_s=c, objective="perf_per_cost", min_GBps=0.01, max_GBps=100, algorithm="ring")
    assert free["bandwidth_GBps"][0] == pytest.approx(0.01, rel=0.01)
