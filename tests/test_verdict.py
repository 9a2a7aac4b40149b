"""The report's verdict (ddlbench/report/verdict.py), by hand: fastest only beyond the run-to-run
noise (with its margin, interval and test), otherwise which are indistinguishable; least memory,
first to the target, what did not run, and the caveats."""
from __future__ import annotations

import math

import pandas as pd

from ddlbench.report.verdict import verdict, verdict_markdown

NAN = math.nan


def cell(label, sps, mem, ttt=NAN, ok=1, runs=1, ci=(NAN, NAN), rng=None, world=2, precision="fp32", each=None,
         began=None):
    return {"label": label, "model": "gpt2_tiny", "world_size": world, "precision": precision, "ok": ok,
            "runs": runs, "samples_per_s": sps, "samples_per_s_ci_low": ci[0], "samples_per_s_ci_high": ci[1],
            "samples_per_s_range": rng, "peak_memory_bytes": mem, "time_to_target_s": ttt,
            "samples_per_s_runs": each if each is not None else [sps], "began_runs": began}


def test_fastest_memory_target_and_failures_per_group():
    cells = pd.DataFrame([
        cell("ddp", 200.0, 3 * 2**30, ttt=12.0, ok=3, runs=3, each=[200.0, 205.0, 195.0]),
        cell("fsdp2:full_shard", 160.0, 2**30, ttt=10.5, ok=3, runs=3, each=[160.0, 150.0, 170.0]),
        cell("deepspeed:zero2", 100.0, 2 * 2**30, ok=0, runs=2),
        cell("ddp", 90.0, 3 * 2**30, world=1),
    ])
    (head1, lines1), (head, lines) = verdict(cells, parity_flags=0, devices=["cuda:0"])
    assert head == "gpt2_tiny, 2 ranks, fp32" and head1 == "gpt2_tiny, 1 rank, fp32"
    # every run of ddp above every run of fsdp2: rank-sum p = 1/20; the ratio's bootstrap interval
    # runs from 195/170 to 205/150
    assert lines[0] == ("fastest: ddp 200.0 samples/s, 1.25x fsdp2:full_shard "
                        "(1.25x [1.15, 1.37], rank-sum p=0.050 over 3+3 interleaved runs)")
    assert lines[1] == "least memory: fsdp2:full_shard 1.0 GiB per rank (ddp: 3.0 GiB)"
    assert lines[2] == "first to the target: fsdp2:full_shard in 10.50 s"
    assert lines[3] == "not ok: deepspeed:zero2 (2 of 2)"
    assert lines1 == ["only ddp ran ok (90.0 samples/s): nothing to compare"]


def test_an_unclear_lead_and_single_runs_say_so_and_cpu_runs_carry_a_caveat():
    # one run of horovod above one of ddp's: p = 2/20, no winner; the pooled spread says how many would tell
    overlap = pd.DataFrame([cell("ddp", 105.0, 1.0, ok=3, runs=3, each=[105.0, 110.0, 95.0]),
                            cell("horovod", 100.0, 2.0, ok=3, runs=3, each=[100.0, 98.0, 104.0]),
                            cell("pipeline", 50.0, 2.0, ok=3, runs=3, each=[50.0, 49.0, 51.0])])
    [(_, lines), (caveats, why)] = verdict(overlap, parity_flags=1, devices=["cpu"])
    assert lines[0].startswith("no clear winner: ddp, horovod not told apart from the run-to-run noise "
                               "(by the median: ddp 105.0 samples/s, 1.05x horovod; 1.05x [")
    assert "rank-sum p=0.35 over 3+3 runs: within the noise; ~" in lines[0]
    assert lines[0].endswith("repeats each would separate a difference this size); slower beyond the noise: pipeline")
    assert caveats == "caveats" and "1 configuration(s) differ" in why[0] and "gloo" in why[1]
    single = pd.DataFrame([cell("ddp", 105.0, 1.0), cell("horovod", 100.0, 2.0)])
    line = verdict(single, 0, ["cuda:0"])[0][1][0]
    assert line.startswith("no clear winner: ddp, horovod") and "one run each: too few to tell" in line
    # a label run in two configurations counts once, with its best
    twice = pd.DataFrame([cell("ddp", 105.0, 1.0), cell("ddp", 101.0, 1.0), cell("horovod", 100.0, 2.0)])
    assert "1.05x horovod" in verdict(twice, 0, ["cuda:0"])[0][1][0]
    assert verdict_markdown([]) == ["No configuration ran ok: see Failures."]
    assert verdict_markdown([("m, 2 ranks", ["a", "b"])]) == ["- **m, 2 ranks**: a; b"]


def test_runs_in_blocks_are_named_as_such():
    """A A A then B B B: a machine that slowed down in between reads as a difference; the verdict
    says the runs were not interleaved (their windows' start times)."""
    blocks = pd.DataFrame([cell("ddp", 200.0, 1.0, ok=3, runs=3, each=[200.0, 201.0, 199.0], began=[1.0, 2.0, 3.0]),
                           cell("horovod", 100.0, 1.0, ok=3, runs=3, each=[100.0, 101.0, 99.0], began=[4.0, 5.0, 6.0])])
    line = verdict(blocks, 0, ["cpu"])[0][1][0]
    assert line.startswith("fastest: ddp") and line.endswith(
        "; runs in blocks, not interleaved (ddp against horovod): a drifting machine reads as a difference")
    mixed = blocks.assign(began_runs=[[1.0, 3.0, 5.0], [2.0, 4.0, 6.0]])
    assert "not interleaved" not in verdict(mixed, 0, ["cpu"])[0][1][0]


def test_compiled_and_float8_runs_are_set_beside_the_eager_ones_not_ranked_among_them():
    rows = [cell("ddp", 23.4, 76.0), cell("fsdp2:full_shard", 24.1, 64.0),
            {**cell("fsdp2:full_shard", 34.6, 50.0), "recipe": "run.compile=true run.float8=true"}]
    for r in rows[:2]:
        r["recipe"] = ""
    got = dict(verdict(pd.DataFrame(rows), parity_flags=0, devices=["cuda:0"]))
    assert got["gpt2_tiny, 2 ranks, fp32"][0].startswith(
        "no clear winner: fsdp2:full_shard, ddp not told apart from the run-to-run noise "
        "(by the median: fsdp2:full_shard 24.1 samples/s, 1.03x ddp; one run each")
    assert got["gpt2_tiny, 2 ranks, fp32, run.compile=true run.float8=true"] == [
        "fsdp2:full_shard 34.6 samples/s, 1.44x the fastest run without run.compile=true run.float8=true "
        "(fsdp2:full_shard 24.1 samples/s)"]


def test_the_recipe_is_read_from_a_frames_row():
    """A summary frame's cells hold numpy booleans (and NaN where a record had no run section)."""
    from ddlbench.report.tables import recipe_of
    frame = pd.DataFrame([{"compile": True, "float8": True}, {"compile": False, "float8": False},
                          {"compile": True, "float8": NAN}])
    assert [recipe_of(r) for _, r in frame.iterrows()] == ["run.compile=true run.float8=true", "", "run.compile=true"]


def test_one_framework_in_two_settings_is_compared_by_its_settings():
    """The H200 plan's gpt2_small: two DDP runs with different settings (136 vs 282 samples/s) were
    'only ddp ran ok: nothing to compare'; they are the comparison."""
    two = pd.DataFrame([{**cell("ddp", 136.0, 1.0), "settings": "run.micro_batch=8"},
                        {**cell("ddp", 282.0, 1.0), "settings": "run.compile=true run.micro_batch=32"}])
    [(_, lines)] = verdict(two, 0, ["cuda:0"])
    assert lines[0] == ("no clear winner among settings: ddp (run.compile=true run.micro_batch=32), ddp (run.micro_batch=8) "
                        "not told apart from the run-to-run noise (by the median: ddp (run.compile=true "
                        "run.micro_batch=32) 282.0 samples/s, 2.07x ddp (run.micro_batch=8); one run each: too few to "
                        "tell a difference from run-to-run noise (needs 3+ interleaved repeats each))")
