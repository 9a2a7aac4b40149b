"""The step as a schedule (ddlbench/estimate/schedule.py, rules.py) by hand, and `bench project`
from a specification (ddlbench/estimate/scale.py, spec.py) end to end: every layout family at
8 / 128 / 1,024 devices, torchtitan's published 8 -> 128 H100 pair, bad input."""
from __future__ import annotations

import json

import pytest
from conftest import bench

from ddlbench.errors import ConfigError
from ddlbench.estimate import rules
from ddlbench.estimate.schedule import Task, simulate


def test_a_stream_waits_for_what_it_needs_and_the_gap_is_charged_to_it():
    s = simulate([Task("A", "compute", 2), Task("X", "comm", 3, kind="ag"), Task("B", "compute", 1, ("A", "X")),
                  Task("C", "comm", 2, ("B",), kind="rs")])
    # A 0-2 and X 0-3 side by side; B waits for X until 3 (1 s exposed), ends 4; C 4-6 after all compute
    assert (s.start["B"], s.end["B"], s.end["C"], s.step_s) == (3, 4, 6, 6)
    assert s.exposed == {"ag": 1, "rs": 2} and s.busy == {"compute": 3, "comm": 5}


def test_a_schedule_that_cannot_go_on_is_refused():
    with pytest.raises(ValueError, match="cannot go on"):
        simulate([Task("T1", "compute", 1, ("T2",)), Task("T2", "comm", 1, ("T1",))])
    with pytest.raises(ValueError, match="repeat"):
        simulate([Task("T", "compute", 1), Task("T", "comm", 1)])
    with pytest.raises(ValueError, match="unknown"):
        simulate([Task("T", "compute", 1, ("nope",))])


PIECES = [rules.Piece("emb", "root", 0, 0, params=10), rules.Piece("b0", "b0", 1, 2, params=20),
          rules.Piece("b1", "b1", 1, 2, params=20), rules.Piece("head", "root", 1, 2, params=10)]


def test_fsdp_prefetches_one_unit_ahead_and_reduce_scatters_as_gradients_are_done():
    """By hand: forward gathers root (0-3) then b0 (3-3.5); b1's gather waits for the embedding's
    forward (as b0 starts) and runs 3.5-4. F: emb at 3, b0 3.5-4.5, b1 4.5-5.5, head 5.5-6.5.
    Backward: b1 regathered after its forward (5.5-6), b0 after the head's backward (8.5-9); B head
    6.5-8.5, b1 8.5-10.5, b0 10.5-12.5, emb 12.5. Reduce-scatters in the order gradients are done:
    b1 10.5-11.5, b0 12.5-13.5, root 13.5-15.5; the optimizer at 15.5. Exposed: 3 + 0.5 of gathers,
    3 of the root's reduce-scatter; 9 s of compute."""
    units = [rules.Unit("root", 3, 2, resharded=False), rules.Unit("b0", 0.5, 1), rules.Unit("b1", 0.5, 1)]
    s = simulate(rules.fsdp(PIECES, units, 1, 0.0, {"gather": "ag", "scatter": "rs", "reduce": "ar"}))
    assert s.step_s == 15.5 and s.busy["compute"] == 9
    assert (s.start["AGf0:b1"], s.start["AGb0:b1"], s.start["AGb0:b0"], s.start["RS:root"]) == (3.5, 5.5, 8.5, 13.5)
    assert s.exposed == {"ag": 3.5, "rs": 3.0}


def test_fsdp_on_a_device_without_streams_blocks_on_every_collective():
    """CPU: FSDP2's collectives run with async_op=False where its hooks issue them, so the step is
    its compute plus every collective, in the order issued. By hand (the units above, HSDP's
    all-reduce 0.25 on b0): gather root 3, F emb 0, gather b0 0.5, F b0 1, gather b1 0.5, F b1 1,
    F head 1 (forward 7); backward: B head 2, gather b1 0.5, B b1 2, scatter b1 1, gather b0 0.5,
    B b0 2, scatter b0 1 + all-reduce 0.25, B emb 0, scatter root 2 (backward 11.25): 18.25, of
    which compute 9; each wait charged to its own kind (gathers 3 + 0.5 x 4, scatters 4, all-reduce
    0.25)."""
    units = [rules.Unit("root", 3, 2, resharded=False), rules.Unit("b0", 0.5, 1, 0.25), rules.Unit("b1", 0.5, 1)]
    kinds = {"gather": "ag", "scatter": "rs", "reduce": "ar"}
    s = simulate(rules.fsdp(PIECES, units, 1, 0.0, kinds, blocking=True))
    assert s.step_s == 18.25 and s.busy["compute"] == 9
    assert s.exposed == {"ag": 5.0, "rs": 4.0, "ar": 0.25}
    assert s.start["RS:b1"] == s.end["B0:b1"] and s.start["AGb0:b0"] == s.end["RS:b1"]
    # with streams (a GPU) the same step overlaps: shorter
    assert simulate(rules.fsdp(PIECES, units, 1, 0.0, kinds)).step_s < 18.25
    # two micro-batches: the blocks gathered twice each, the root once, the reduction once after
    # the last: the first micro-batch 7 + 7 (its backward without reductions), the second 4 + 11.25
    two = simulate(rules.fsdp(PIECES, units, 2, 0.0, kinds, blocking=True))
    assert two.step_s == 29.25 and two.exposed == {"ag": 3 + 0.5 * 8, "rs": 4.0, "ar": 0.25}


def test_fsdp_accumulates_then_reduces_once():
    """Two micro-batches: blocks gathered four times (twice each micro-batch), the root once, one
    reduce-scatter per unit; the step at least twice the compute of one."""
    units = [rules.Unit("root", 3, 2, resharded=False), rules.Unit("b0", 0.5, 1), rules.Unit("b1", 0.5, 1)]
    tasks = rules.fsdp(PIECES, units, 2, 0.0, {"gather": "ag", "scatter": "rs", "reduce": "ar"})
    names = [t.name for t in tasks]
    assert sum(n.startswith("AG") and n.endswith(":b0") for n in names) == 4
    assert sum(n.startswith("AG") and n.endswith(":root") for n in names) == 1
    assert sorted(n for n in names if n.startswith("RS")) == ["RS:b0", "RS:b1", "RS:root"]
    assert simulate(tasks).busy["compute"] == 18


def test_ddp_buckets_close_in_backward_order():
    assert rules.buckets(PIECES, 1, 25) == [("b1", 30), ("emb", 30)]
    bs = [("b1", 1.0), ("emb", 1.5)]
    # F 0-3; B head 3-5, b1 5-7, b0 7-9; bucket 0 7-8 (hidden), bucket 1 9-10.5 (exposed)
    s = simulate(rules.bucketed(PIECES, bs, 1, 0.0, "ar", "grad"))
    assert s.step_s == 10.5 and s.exposed == {"ar": 1.5}
    # ZeRO-2: the parameters gathered after the optimizer, with nothing left to hide behind
    z = simulate(rules.bucketed(PIECES, bs, 1, 0.0, "rs", "grad", after_optimizer=(2.0, "ag")))
    assert z.step_s == 12.5 and z.exposed == {"rs": 1.5, "ag": 2.0}


def test_a_tied_weight_is_in_the_schedule_once():
    """GPT-2's wte (a tied Llama's embed_tokens) is the embedding's and the head's: the profile
    counts it in both pieces, the schedule once, in the embedding (its gradient is complete after
    the embedding's backward, the last), so data-parallel payloads are the model's parameters
    (llama_tiny's DDP run all-reduces 1,313,280 bytes a step, 4 x its 328,320 unique parameters;
    counting the tie twice priced 1,444,352)."""
    from ddlbench.adapters.cost import ModelProfile, Piece
    from ddlbench.estimate.profile import profile
    from ddlbench.estimate.scale import piece_params
    from ddlbench.planning.config import plan_from_overrides

    prof = ModelProfile(params=32, largest_block_params=20, blocks=1, activation_bytes_per_sample=0,
                        checkpointed_bytes_per_sample=0, boundary_bytes_per_sample=0, pieces=(Piece(10, tied_params=4), Piece(20, split_params=16), Piece(6, tied_params=4)))
    assert piece_params(prof, 1) == [10, 20, 2]
    assert piece_params(prof, 2) == [10, 12, 2]
    untied = ModelProfile(params=36, largest_block_params=20, blocks=1, activation_bytes_per_sample=0,
                          checkpointed_bytes_per_sample=0, boundary_bytes_per_sample=0, pieces=(Piece(10), Piece(20), Piece(6)))
    assert piece_params(untied, 1) == [10, 20, 6]
    for model in ("llama_tiny", "gpt2_tiny"):
        p = profile(plan_from_overrides([f"model={model}"]).cfg.model)
        assert sum(piece_params(p, 1)) == p.params
    assert profile(plan_from_overrides(["model=llama_tiny"]).cfg.model).params == 328320
    # a pipeline's first and last stage each hold a copy and sum their gradients after the schedule:
    # one all-reduce of the tied weight between them (llama_tiny's record: 131,072 bytes = 4 x 256 x 128)
    assert prof.stage_tied_params(1) == 4 and untied.stage_tied_params(1) == 0
    from ddlbench.estimate.memcheck import cost_of_plan
    from ddlbench.estimate.scale import Pricing, step_of
    from ddlbench.network import model
    plan = plan_from_overrides(["model=llama_tiny", "framework=pipeline_1f1b", "framework.options.pp=2",
                                "framework.options.dp=2", "launcher.nproc=4", "run.micro_batch=2"])
    llama = profile(plan.cfg.model)
    assert llama.stage_tied_params(1) == 256 * 128
    tied = [t for t in cost_of_plan(plan, llama, 2).traffic if t.what.startswith("tied")]
    assert [(t.kind, t.bytes, t.ranks, t.stride) for t in tied] == [("all_reduce", 131072.0, 2, 2)]
    import dataclasses
    pricing = Pricing(model.load("dgx_h100"))
    step = step_of(plan, llama, pricing, 1e12, "none", 2)
    no_tie = dataclasses.replace(llama, pieces=tuple(dataclasses.replace(q, tied_params=0) for q in llama.pieces))
    without = step_of(plan, no_tie, pricing, 1e12, "none", 2)
    # (the stages' data-parallel all-reduces then start together after it, not each after its own
    # last backward: within 0.1%)
    assert step["step_s"] - without["step_s"] == pytest.approx(pricing.seconds("all_reduce", 131072.0, 2, 2), rel=1e-3)


def test_a_shaped_links_bucket_is_saved_up_while_it_idles_and_spent_in_time_order():
    """tbf's token bucket (benchmarks/tbf_probe.py at 100 Mbit/s: a 256 KiB send 21.9 ms back to
    back, 17.0 ms after 5 ms idle, 12.0 ms after 20): in seconds of the link's time, here a bucket
    of 10, a transfer of 21."""
    step = [Task("c", "compute", 3), Task("x", "net", 21, ("c",), "send@link", ("link",))]
    # alone: the link idle before the step -> full bucket (the first pass), then the steady state:
    # the step ends with the transfer, so the next one starts with the 3 s its compute saved up
    s = simulate(step, {"link": 10})
    assert (s.start["x"], s.end["x"], s.step_s) == (3, 21, 21)
    assert s.exposed == {"send@link": 18}
    # idle 12 before it: capped at the bucket
    s = simulate([Task("c", "compute", 12), Task("x", "net", 21, ("c",), "send@link", ("link",))], {"link": 10})
    assert s.end["x"] == 12 + 11
    # a link without a bucket, or a task on no link: priced as before
    assert simulate(step, {}).step_s == 24 and simulate(step, {"other": 10}).step_s == 24
    # two transfers back to back: the second finds the bucket spent; a task drawing on two links
    # gets the least of them and takes it from both
    two = [Task("c", "compute", 4), Task("x", "net", 6, ("c",), "k@link", ("a",)),
           Task("y", "net", 6, ("x",), "k@link", ("a", "b"))]
    s = simulate(two, {"a": 5, "b": 5})
    # steady state: a is last used by y (ends at the step's end) -> 4 saved by the compute; b idles
    # since y a step ago -> full (5); x takes 4 from a (6 -> 2, ends 6), y: a has 0 -> 6, ends 12
    assert (s.end["x"], s.end["y"], s.step_s) == (6, 12, 12)
    # tasks start in time order across streams: the later one (by time) finds the bucket spent
    order = [Task("c", "compute", 10), Task("late", "s1", 4, ("c",), "k@link", ("a",)),
             Task("early", "s2", 4, (), "k@link", ("a",))]
    s = simulate(order, {"a": 5})
    # steady state: 'late' (t=10) finds 5 saved (idle since 'early' ended), spends 4, leaves 1 to
    # the next step's 'early' (t=0): 4 - 1 = 3
    assert (s.end["early"], s.end["late"], s.step_s) == (3, 10, 10)


def test_ranks_sharing_a_core_get_no_bucket_inside_their_node():
    """bench cluster's 2 x 2 nodes on a small host: a node's two devices share its core, and their
    collectives inside the node get none of tbf's bucket (measured: tbf_probe.py --inside-node);
    the node links' collectives keep theirs."""
    from ddlbench.estimate.scale import Pricing
    from ddlbench.network.model import Dimension, Network
    net = Network("c", (Dimension("node", 2, 25e6, 1e-4, burst_bytes=131072),
                        Dimension("link", 2, 6.25e6, 1e-4, shared=True, burst_bytes=131072)))
    p = Pricing(net, "gloo")
    # the shared node link's bucket in seconds of the whole link (2 devices' shares)
    assert p.buckets() == pytest.approx({"node": 131072 / 25e6, "link": 131072 / 12.5e6})
    assert p.buckets(ranks_per_core=2) == pytest.approx({"link": 131072 / 12.5e6})


def test_more_than_a_bucket_both_ways_at_once_gets_no_credit():
    """benchmarks/tbf_probe.py at 100 Mbit/s after 20 ms idle (bucket 10.5 ms): an isend/irecv pair
    of 256 KiB each way 23.4 ms (the line 21.9), an all-gather of 384 KiB each way 34.8, of 128 KiB
    2.7 ms; a send of 256 KiB one way 12.0. Here a bucket of 10 after 12 idle."""
    def one(seconds, **kw):
        return simulate([Task("c", "compute", 12), Task("x", "net", seconds, ("c",), "all_gather@link", ("link",), **kw)],
                        {"link": 10}).end["x"] - 12
    assert one(21) == 11 and one(21, both_ways=True) == 21      # more than the bucket each way: none
    assert one(8, both_ways=True) == 0                           # within the bucket: all of it
    # a collective's kind says which: gloo's all-gather and all-to-all send each way at once, its ring
    # all-reduce (half each way in each of two phases) and a send do not
    from ddlbench.estimate.scale import on_links
    got = on_links([Task(k, "net", 1.0, (), f"{k}@link") for k in ("all_gather", "all_to_all", "all_reduce", "send")])
    assert [(t.links, t.both_ways) for t in got] == [(("link",), True), (("link",), True), (("link",), False),
                                                     (("link",), False)]
    # a pipeline's link: a send while the other direction carries more than a bucket gets none
    # (both directions idle 12 before: '>0' alone would get 10)
    pair = [Task("c", "compute", 12), Task("g", "<0", 21, ("c",), "send@link", ("<0",)),
            Task("a", ">0", 21, ("c",), "send@link", (">0",))]
    s = simulate(pair, {">0": 10, "<0": 10})
    # of two starting together, the one the schedule starts first still finds the other way idle
    assert {s.end["g"] - 12, s.end["a"] - 12} == {11, 21}
    alone = simulate([Task("c", "compute", 12), Task("a", ">0", 21, ("c",), "send@link", (">0",))], {">0": 10})
    assert alone.end["a"] - 12 == 11


def test_a_pipeline_waits_where_torchs_schedules_wait():
    """One boundary, forward 1, backward 2, a send 3 either way, 2 micro-batches.
    1F1B (Schedule1F1B): stage 0 runs F0, F1 (pp - 0 = 2 forwards first), waits for a0's send
    (4), a1 goes out after it (4-7); stage 1: F0 4-5, B0 5-7, g0 7-10, waits for g0 and a1 (10), F1
    10-11, B1 11-13, g1 13-16; stage 0: B0 waits for a1's send and g0 (10) 10-12, B1 for g1: 16-18.
    GPipe: stage 0's sends 1-4, 4-7; stage 1: F0 4-5, F1 7-8, B0 8-10 (g0 10-13), B1 10-12 (g1 13-16);
    stage 0: B0 13-15, B1 16-18. (The flow-shop formula of step.pipeline_step says 15.)"""
    for schedule in ("1f1b", "gpipe"):
        s = simulate(rules.pipeline([(1, 2), (1, 2)], 2, 3, schedule, "send@link"))
        assert s.step_s == 18, schedule
    s = simulate(rules.pipeline([(1, 2), (1, 2)], 2, 3, "1f1b", "send@link"))
    assert [s.end[n] for n in ("S>0.0", "S>0.1", "F1.1", "S<0.0", "S<0.1", "B0.0", "B0.1")] == [4, 7, 11, 10, 16, 12, 18]
    # after the schedule: the tied weight's all-reduce between the first and the last stage, then
    # each stage's data-parallel all-reduce
    s = simulate(rules.pipeline([(1, 2), (1, 2)], 2, 3, "1f1b", "send@link", (1.5, "all_reduce@link"),
                                [(2, "all_reduce@node"), (0.5, "all_reduce@node")]))
    assert (s.start["tied"], s.end["AR0"], s.end["AR1"], s.step_s) == (18, 21.5, 20, 21.5)
    # a shaped link's bucket (5 s of the link): the first send of each direction after an idle spell
    # is shorter; the schedule as a whole too
    t = rules.pipeline([(1, 2), (1, 2)], 2, 3, "1f1b", "send@link")
    s = simulate(t, {">0": 5, "<0": 5})
    assert s.end["S>0.0"] - s.start["S>0.0"] < 3 and s.step_s < 18


def test_interleaved_1f1b_runs_each_rank_in_torchs_order():
    """rules.interleaved_order against torch's own ScheduleInterleaved1F1B arithmetic
    (torch.distributed.pipelining.schedules: _get_warmup_ops, _get_1f1b_rank_ops; its no-op
    padding only aligns the ranks' lists) over ranks, depths, stages per rank and micro-batches."""
    from torch.distributed.pipelining.schedules import _ComputationType, _get_1f1b_rank_ops, _get_warmup_ops

    def torchs(rank, pp, v, m):
        per = m // max(1, m // pp)
        warm = _get_warmup_ops(rank, v, per, pp, m, multiply_factor=2)
        steady = v * m - warm
        ops = _get_1f1b_rank_ops(v, pp, warm, steady, v * m - steady, rank,
                                 lambda i: (i // per) % v * pp + rank,
                                 lambda i: (v - 1 - ((i - warm) // per) % v) * pp + rank)
        return [("F" if a.computation_type == _ComputationType.FORWARD else "B", a.stage_index, a.microbatch_index)
                for a in ops if a is not None]

    cases = [(pp, v, m) for pp in (2, 3, 4, 8) for v in (2, 3, 4) for m in (pp, 2 * pp, 8, 10, 12, 32)
             if m % max(1, m // pp) == 0]
    for pp, v, m in cases:
        for r in range(pp):
            assert rules.interleaved_order(r, pp, v, m) == torchs(r, pp, v, m), (pp, v, m, r)
    with pytest.raises(ValueError, match="not a multiple of its 2 rounds"):
        rules.interleaved_order(0, 4, 2, 9)     # 9 // 4 = 2 rounds, 9 % 2: torch refuses it too


def test_interleaved_1f1b_halves_the_bubble_by_hand():
    """pp 2, 2 stages a rank (stages 0, 2 on rank 0; 1, 3 on rank 1), 2 micro-batches, each stage
    forward 1 and backward 2, free sends. Orders (torch's): rank 0 F0.0 F0.1 F2.0 F2.1 B2.0 B2.1 B0.0
    B0.1; rank 1 F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 B1.0 B1.1. By hand: rank 0 F0.0 0-1, F0.1 1-2; rank 1
    F1.0 1-2, F1.1 2-3; rank 0 F2.0 2-3, F2.1 3-4; rank 1 F3.0 3-4, B3.0 4-6, F3.1 6-7, B3.1 7-9;
    rank 0 B2.0 6-8, B2.1 9-11; rank 1 B1.0 9-11, B1.1 11-13; rank 0 B0.0 11-13, B0.1 13-15: 15, the
    12 s of compute a rank and (pp - 1) / v = half of a 6 s slot. One stage a rank (forward 2,
    backward 4): (m + pp - 1) x 6 = 18."""
    s = simulate(rules.pipeline([(1, 2)] * 4, 2, 0.0, "interleaved_1f1b", "send@link", stages_per_rank=2))
    assert s.step_s == 15
    assert [s.end[n] for n in ("F2.1", "B3.0", "F3.1", "B2.0", "B1.0", "B0.1")] == [4, 6, 7, 8, 11, 15]
    assert simulate(rules.pipeline([(2, 4)] * 2, 2, 0.0, "1f1b", "send@link")).step_s == 18
    # sends go over each rank's own link, the wrap-around (rank 1 -> rank 0) too, and a rank ends
    # once its sends are delivered; the data-parallel all-reduce of each rank waits for that
    t = rules.pipeline([(1, 2)] * 4, 2, 0.5, "interleaved_1f1b", "send@link", reduce=[(1, "ar"), (1, "ar")],
                       stages_per_rank=2)
    links = {x.name: x.stream for x in t if x.name.startswith("S")}
    assert (links["S>1.0"], links["S>2.0"], links["S<1.0"], links["S<0.0"]) == (">1", ">0", "<1", "<0")
    s = simulate(t)
    assert s.end["stage0.sent"] >= max(s.end[n] for n in links if n.startswith(("S>0", "S>2", "S<1")))
    assert s.start["AR0"] == s.end["stage0.sent"] and s.step_s > 15


def test_a_pool_serves_whichever_task_is_ready_first():
    """A shared stream (schedule.POOL) does not keep the listed order: b, ready at 1, runs before a,
    ready at 3; an ordinary stream would run a first."""
    from ddlbench.estimate.schedule import POOL
    tasks = [Task("slow", "compute", 3), Task("fast", "other", 1),
             Task("a", POOL + "x", 2, ("slow",)), Task("b", POOL + "x", 2, ("fast",))]
    s = simulate(tasks)
    assert (s.start["b"], s.start["a"], s.step_s) == (1, 3, 5)
    plain = simulate([Task(t.name, t.stream.removeprefix(POOL), t.seconds, t.after) for t in tasks])
    assert (plain.start["a"], plain.start["b"], plain.step_s) == (3, 5, 7)


def test_pipeline_replicas_sharing_a_core_and_a_link_take_turns():
    """Two replicas of a 2-stage 1F1B pipeline, one micro-batch, each stage's two replicas on one
    core and each boundary's sends on one link (bench cluster's 2 x 2 nodes): forward 1, backward
    2, a send 1, each at the whole core's or link's speed. By hand: F0#0 0-1, F0#1 1-2; S#0 1-2,
    S#1 2-3; F1#0 2-3; at 3 both B1#0 and F1#1 are ready, the first listed goes: B1#0 3-5, F1#1
    5-6, B1#1 6-8; gradients back S#0 5-6, S#1 8-9; B0#0 6-8, B0#1 9-11: 11. In step, each at half
    the core and link (the model without turns): 2 + 2 + 2 + 4 + 2 + 4 = 16."""
    one = rules.pipeline([(1, 2), (1, 2)], 1, 1.0, "1f1b", "send@link", replicas=2)
    s = simulate(one)
    assert s.step_s == 11 and (s.start["B1.0#0"], s.start["F1.0#1"], s.end["B0.0#1"]) == (3, 5, 11)
    assert simulate(rules.pipeline([(2, 4), (2, 4)], 1, 2.0, "1f1b", "send@link")).step_s == 16
    # the stages' data-parallel all-reduce waits for both replicas
    red = rules.pipeline([(1, 2), (1, 2)], 1, 1.0, "1f1b", "send@link", reduce=[(0.5, "ar"), (0.5, "ar")], replicas=2)
    ar0 = next(t for t in red if t.name == "AR0")
    assert set(ar0.after) == {"B0.0#0", "B0.0#1"} and simulate(red).end["AR0"] == 11.5


def test_cpu_pieces_are_timed_with_the_threads_a_rank_gets():
    """On a CPU a device is a rank with its share of the host's cores: the pieces and the framework's
    step (a spawned process: OMP_NUM_THREADS) are timed with launch.local.threads_per_rank's count,
    and the caller's settings come back after."""
    import os

    import torch

    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.project.spec import cpu_threads
    plan = plan_from_overrides(["model=llama_tiny", "framework=ddp", "launcher.nproc=2", "launcher.threads_per_rank=1"])
    before, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    with cpu_threads(plan) as threads:
        assert threads == 1 and torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    assert torch.get_num_threads() == before and os.environ.get("OMP_NUM_THREADS") == env
    with cpu_threads(None) as threads:          # a GPU: nothing changed
        assert threads is None and torch.get_num_threads() == before


def test_tensor_parallel_collectives_are_exposed():
    tp = [rules.Piece("b0", "b0", 1, 2, params=1, tp_forward_s=0.25, tp_backward_s=0.5)]
    s = simulate(rules.bucketed(tp, [], 1, 0.0, "ar", "grad", tp_kind="tp@nvlink"))
    # F 0-1, its all-reduces 1-1.25, B 1.25-3.25, its all-reduces 3.25-3.75, then the optimizer
    assert s.step_s == 3.75 and s.exposed == {"tp@nvlink": 0.75}


def test_a_group_is_priced_over_the_dimensions_it_spans():
    from ddlbench.estimate.scale import Pricing
    from ddlbench.network import model
    net = model.load("dgx_h100")
    p = Pricing(net)
    assert [p.label("all_gather", 8, 1), p.label("all_gather", 128, 1), p.label("all_gather", 16, 8),
            p.label("all_reduce", 8, 1024)] == ["all_gather@nvlink", "all_gather@leaf", "all_gather@leaf",
                                                "all_reduce@spine"]
    # 1 GB over one node: a ring on NVLink, 7 steps of 2 us and 7/8 of the bytes at 450 GB/s
    assert p.seconds("all_gather", 1e9, 8, 1) == pytest.approx(7 * 2e-6 + 7 / 8 * 1e9 / 450e9)
    assert p.seconds("all_gather", 1e9, 1, 1) == 0.0


def spec_rows(overrides, local_batch=2, ac="none", sizes=(8, 128, 1024), eff=0.5):
    from ddlbench.estimate.scale import Pricing
    from ddlbench.network import model
    from ddlbench.project.spec import Spec, rows
    base = () if any(o.startswith("model=") for o in overrides) else ("model=llama_tiny",)
    spec = Spec((*base, "run.precision=bf16", *overrides), local_batch, 989.4e12, ac)
    return rows(spec, Pricing(model.load("dgx_h100")), list(sizes), eff)


@pytest.mark.parametrize("overrides,layout128", [
    (("framework=fsdp_full",), (1, 128, 1, 1)),
    (("framework=fsdp_hybrid",), (16, 8, 1, 1)),
    (("framework=tensor_parallel_fsdp", "framework.options.tp=2"), (1, 64, 2, 1)),
    (("framework=pipeline_1f1b", "framework.options.pp=2", "framework.options.dp=-1",
      "run.micro_batch=1"), (64, 1, 1, 2)),
    (("framework=ddp",), (128, 1, 1, 1)),
    (("framework=deepspeed_zero2",), (1, 128, 1, 1)),
    (("framework=deepspeed_ulysses", "framework.options.sp=2", "model.attention=sdpa"), (1, 64, 1, 1)),
    (("framework=context_parallel", "framework.options.cp=2", "model.attention=sdpa_causal"), (1, 64, 1, 1)),
    (("framework=expert_parallel", "model=moe_tiny"), (1, 128, 1, 1)),
    (("framework=expert_parallel_tp", "model=moe_tiny"), (1, 64, 2, 1)),
])
def test_every_layout_family_is_projected_at_8_128_and_1024(overrides, layout128):
    out = spec_rows(overrides)
    assert [r["devices"] for r in out] == [8, 128, 1024]
    r128 = out[1]
    assert tuple(r128["layout"][k] for k in ("dp_replicate", "dp_shard", "tp", "pp")) == layout128
    for r in out:
        assert r["step_s"] >= r["compute_s"] > 0 and r["memory_per_rank_bytes"] > 0
        assert r["exposed_comm_s"] == pytest.approx(sum(r["exposed_by_kind_s"].values()), rel=1e-9, abs=1e-12)
        assert r["comm_by_kind_s"] and all(v > 0 for v in r["comm_by_kind_s"].values())
        assert all("@" in k or k == "pipeline bubble" for k in r["exposed_by_kind_s"])
    # leaving the node slows the collectives: the step does not shorten from 8 to 128 devices
    assert out[1]["step_s"] >= out[0]["step_s"] and out[1]["tokens_per_s_per_device"] <= out[0]["tokens_per_s_per_device"]


def test_expert_parallelism_sends_four_all_to_alls_a_moe_block_and_shards_experts_over_their_replicas():
    """moe_tiny (2 blocks, both sparse, 8 experts) under expert_parallel ep 2 at 8 ranks: each MoE
    block exchanges its tokens' counts per expert, then its routed tokens (seq x top_k x hidden x 2
    bytes a sample) are all-to-all'd twice in forward and twice in backward among the 2 ep ranks; each block's experts (1/ep of them) gathered over the
    8 / 2 = 4 ranks that hold the same experts, 2 apart; the layout says ep."""
    from ddlbench.estimate.profile import cached_profile
    from ddlbench.estimate.scale import Pricing, moe_blocks
    from ddlbench.network import model
    from ddlbench.planning.config import plan_from_overrides
    plan = plan_from_overrides(["model=moe_tiny", "framework=expert_parallel", "run.precision=bf16", "launcher.nproc=8"])
    prof = cached_profile(plan.cfg.model, "bf16", "cpu")[0]
    assert prof.moe_layers == 2 and prof.routed_bytes_per_sample == 128 * 2 * 128 * 2
    p = Pricing(model.load("dgx_h100"))
    one = p.seconds("all_to_all", prof.routed_bytes_per_sample * 2, 2, 1)
    counts = p.seconds("all_to_all", 8 * 8, 2, 1)       # the tokens' counts per expert, int64, first
    r8 = spec_rows(("framework=expert_parallel", "model=moe_tiny"), sizes=(8,))[0]
    assert r8["layout"]["ep"] == 2 and r8["layout"]["dp_shard"] == 8
    assert r8["comm_by_kind_s"]["all_to_all@nvlink"] == pytest.approx(2 * (counts + 4 * one), rel=1e-9)
    # with ep 8 the experts are not gathered at all (one rank holds each); the dense part still is
    r = spec_rows(("framework=expert_parallel", "model=moe_tiny", "framework.options.ep=8"), sizes=(8,))[0]
    assert r["layout"]["ep"] == 8 and r["comm_by_kind_s"]["all_gather@nvlink"] < r8["comm_by_kind_s"]["all_gather@nvlink"]
    assert moe_blocks(4, 4) == [True] * 4 and moe_blocks(4, 2) == [False, True, False, True]
    # inside pipeline stages over the replicas (pp 2 x dp 2, ep 2, 4 micro-batches of 2): each stage's one MoE
    # block pays its counts and four all-to-alls a micro-batch in its slot, exposed
    pipe = spec_rows(("framework=pipeline_1f1b", "model=moe_tiny", "model.moe.aux_loss_coef=0", "framework.options.pp=2",
                      "framework.options.dp=-1", "framework.options.ep=2", "run.micro_batch=2"), local_batch=8, sizes=(4,))[0]
    assert (pipe["layout"]["grad_accum"], pipe["layout"]["dp_replicate"], pipe["layout"]["ep"]) == (4, 2, 2)
    assert pipe["exposed_by_kind_s"]["all_to_all@nvlink"] == pytest.approx(4 * (counts + 4 * one), rel=1e-9)
    # with FSDP2 inside the stages (pp 2 x dp_shard 4, the ep 2 ranks borrowed from dp_shard: NeMo Automodel's layout):
    # a stage's one MoE block's experts (1/ep of them) gathered in bf16 and reduce-scattered in fp32 over the
    # 4 / 2 = 2 ranks that hold them, 2 apart; the dense part over dp_shard 4; a rank keeps 1/4 of its whole stage
    from ddlbench.adapters.stages import rank_shares
    fsdp = plan_from_overrides(["model=moe_tiny", "model.moe.aux_loss_coef=0", "framework=pipeline_fsdp",
                                "framework.options.pp=2", "framework.options.dp_shard=4", "framework.options.ep=2",
                                "run.precision=bf16", "launcher.nproc=8"])
    cost = fsdp.variant.cost_model(fsdp.dims, prof, "bf16")
    layer_experts = prof.experts_params / prof.moe_layers
    kinds = {t.what: t for t in cost.traffic}
    gathered, scattered = kinds["stage experts (FSDP2, gathered once a schedule)"], kinds["expert gradients (FSDP2)"]
    assert (gathered.ranks, gathered.stride, scattered.ranks, scattered.stride) == (2, 2, 2, 2)
    assert gathered.bytes * gathered.count == pytest.approx(2 * layer_experts / 2)
    assert scattered.bytes * scattered.count == pytest.approx(4 * layer_experts / 2)
    dense = kinds["stage parameters (FSDP2, gathered once a schedule)"]
    assert dense.ranks == 4 and dense.bytes * dense.count == pytest.approx(2 * (cost.piece - layer_experts))
    assert cost.shard_ranks == 4 and cost.piece == max(share.params for share, _, _ in rank_shares(prof, "1f1b", 2, 1, 1))
    r = spec_rows(("framework=pipeline_fsdp", "model=moe_tiny", "model.moe.aux_loss_coef=0", "framework.options.pp=2",
                   "framework.options.dp_shard=-1", "framework.options.ep=2", "run.micro_batch=2"), local_batch=8,
                  sizes=(8,))[0]
    assert (r["layout"]["dp_shard"], r["layout"]["ep"]) == (4, 2) and r["comm_by_kind_s"]["all_gather@nvlink"] > 0


def test_mfu_is_the_efficiency_times_the_share_of_the_step_spent_computing():
    """No recompute, dp = world, eager attention (the run on a CPU): the compute stream runs exactly
    the model FLOPs at the efficiency. Under a fused causal kernel (the same model on a GPU) it runs
    half of the T x T scores and its backward recomputes them (five T x T matmuls to the forward's two),
    so MFU (model FLOPs: the full T x T, backward twice forward, PaLM's convention) is the efficiency
    times the compute share times model / executed FLOPs."""
    from ddlbench.estimate.profile import cached_profile
    from ddlbench.planning.config import plan_from_overrides
    for r in spec_rows(("framework=fsdp_full", "model.attention=eager"), eff=0.5):
        assert r["mfu"] == pytest.approx(0.5 * r["compute_s"] / r["step_s"], rel=1e-9)
    prof = cached_profile(plan_from_overrides(["model=llama_tiny", "framework=fsdp_full"]).cfg.model, "bf16", "cuda")[0]
    assert prof.causal_skip == 0.5
    model = sum(p.flops for p in prof.pieces)
    executed = sum(p.executed_flops(1, 0.5) for p in prof.pieces)
    # llama_tiny: 2 blocks whose T x T matmuls are 4 x 128^2 x 128 = 8,388,608 forward FLOPs per sample each
    assert model - executed == pytest.approx(2 * 8_388_608 / 2)
    attention = sum(p.attention_flops * 0.5 for p in prof.pieces)     # the executed T x T matmuls, forward
    trained = 3 * executed + 0.5 * attention                           # flash's backward: 2.5 x theirs
    for r in spec_rows(("framework=fsdp_full", "model.attention=sdpa_causal"), eff=0.5):
        assert r["mfu"] == pytest.approx(0.5 * r["compute_s"] / r["step_s"] * 3 * model / trained, rel=1e-9)


def test_torchtitans_8_to_128_h100_pair_within_3_percent(tmp_path):
    """Llama 3.1 8B, FSDP, local batch 2, seq 8192, selective AC, eager (torchtitan's
    docs/performance.md, Tables 1 and 3: 5,762 and 5,605 tokens/s per GPU): compute calibrated on
    the 8-GPU point, the 128-GPU point predicted."""
    proc = bench("project", "model=llama_8b", "framework=fsdp_full", "network=dgx_h100", "hardware=H100",
                 "run.precision=bf16", "run.micro_batch=2", "local_batch=2", "ac=selective_op", "calibrate=5762@8",
                 "world_sizes=[8,128]", "device_memory_gb=96", f"out={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "projection.json").read_text())
    r8, r128 = doc["rows"]
    assert r8["tokens_per_s_per_device"] == pytest.approx(5762, rel=1e-3)
    assert r128["tokens_per_s_per_device"] == pytest.approx(5605, rel=0.03)
    assert r128["exposed_comm_s"] > r8["exposed_comm_s"] > 0
    assert "calibrated" in doc["efficiency_source"] and "5762 tokens/s" in proc.stdout
    assert (tmp_path / "projection.csv").read_text().count("\n") == 3


def test_a_specification_naming_a_gpu_is_planned_for_that_gpu(tmp_path):
    """hardware=H100 on this CPU host: the configuration is planned as on the GPU (run.device=cuda:
    model.attention auto is sdpa_causal there, which ring attention needs), and the record says so."""
    proc = bench("project", "model=llama_tiny", "framework=context_parallel", "network=dgx_h100", "hardware=H100",
                 "world_sizes=[8]", f"out={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "projection.json").read_text())
    assert "run.device=cuda" in doc["specification"] and doc["rows"][0]["layout"]["cp"] == 2


def test_a_pipeline_keeps_its_depth_across_worlds_and_checkpoints_its_stages(tmp_path):
    """pp fixed, the data-parallel degree derived from each world (framework.options.dp=-1, as
    torchtitan's ParallelDims derives dp_shard), and ac=full under the pipeline (refused before):
    the checkpointed stages hold less than the same layout without it, and recompute (more compute)."""
    common = ("model=llama_tiny", "network=dgx_h100", "framework=pipeline_1f1b", "hardware=H100", "world_sizes=[4,8]",
              "framework.options.pp=2", "framework.options.dp=-1", "local_batch=2", "run.micro_batch=1")
    docs = {}
    for ac in ("none", "full"):
        proc = bench("project", *common, f"ac={ac}", f"out={tmp_path / ac}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        docs[ac] = json.loads((tmp_path / ac / "projection.json").read_text())
    rows = docs["full"]["rows"]
    assert [(r["layout"]["pp"], r["layout"]["dp_replicate"], r["layout"]["grad_accum"]) for r in rows] == [(2, 2, 2), (2, 4, 2)]
    for plain, ckpt in zip(docs["none"]["rows"], rows):
        assert ckpt["memory_parts_bytes"]["activations"] < plain["memory_parts_bytes"]["activations"]
        assert ckpt["compute_s"] > plain["compute_s"]


@pytest.mark.parametrize("args,message", [
    (("framework=horovod", "hardware=H100"), "no schedule rules for horovod"),
    (("framework=fsdp_full",), "give hardware="),
    (("framework=fsdp_full", "hardware=B300"), "has no peak"),
    (("framework=fsdp_full", "hardware=H100", "calibrate=5@"), "calibrate must be"),
    (("framework=fsdp_full", "hardware=H100", "calibrate=1e12@8"), "faster than this model runs at 100%"),
    (("framework=fsdp_full", "hardware=H100", "calibrate=nan@8"), "calibrate must be"),
    # 95% of the peak: below 100% (1,206,021 tokens/s here), above any dense training step (issue 65)
    (("framework=fsdp_full", "hardware=H100", "calibrate=1205000@8"), "above max_efficiency=0.85"),
    (("framework=tensor_parallel_fsdp", "framework.options.tp=3", "hardware=H100"), "not divisible"),
    (("framework=fsdp_full", "hardware=H100", "world_sizes=[8,1000000]"), "exceed network"),
    (("framework=fsdp_full", "hardware=H100", "ac=some"), "activation_checkpointing must be one of"),
    (("framework=horovod", "hardware=H100", "ac=full"), "no activation_checkpointing option"),
])
def test_bad_specifications_are_refused_with_the_reason(args, message):
    proc = bench("project", "model=llama_tiny", "network=dgx_h100", *args)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_specification_without_a_model_is_refused():
    with pytest.raises(ConfigError, match="needs model= and framework="):
        from ddlbench.project.spec_command import parse
        parse(["framework=ddp", "network=dgx_h100"])


@pytest.mark.parametrize("framework,extra,keep", [
    ("tensor_parallel", (), {"tp": 2}),
    ("pipeline_1f1b", ("run.global_batch=4",), {"pp": 2}),
    ("deepspeed_ulysses", ("model.attention=sdpa",), {"cp": 2}),
])
def test_a_model_parallel_run_is_projected_through_its_schedule(framework, extra, keep, tmp_path):
    """`bench project RUN` on a TP or PP run (refused before: data-parallel records only): its
    configuration re-planned with its tp / pp kept and data parallelism over the rest, the compute's
    efficiency solved so the simulated step on the network it ran on gives its measured throughput."""
    from conftest import run_record

    from ddlbench.estimate.scale import Pricing
    from ddlbench.network import model
    from ddlbench.project.spec import Spec, rows, solve_efficiency
    _, rec = run_record(tmp_path / "run", f"framework={framework}", "model=llama_tiny", "launcher.nproc=2",
                        "run.warmup_steps=1", "run.measure_steps=3", *extra, timeout=240)
    assert rec["status"] == "ok", rec.get("error")
    proc = bench("project", str(tmp_path / "run"), "network=dgx_h100", "world_sizes=[2,8,64]", f"out={tmp_path / 'p'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "p" / "projection.json").read_text())
    assert [r["devices"] for r in doc["rows"]] == [2, 8, 64]
    for r in doc["rows"]:
        assert all(r["layout"][k] == v for k, v in keep.items()) and r["step_s"] >= r["compute_s"] > 0
    assert "reproduced on local_gloo" in doc["efficiency_source"]
    # the calibration by hand: at the run's own size, on its own network, the measured throughput
    par = rec["parallel"]
    spec = Spec((), par["global_batch"] // par["dp"], rec["flops"]["peak_per_device"], config=rec["config"],
                device="cpu", keep=keep)
    local = Pricing(model.load("local_gloo"), "gloo")
    measured = rec["throughput"]["tokens_per_s"] / 2
    eff = solve_efficiency(spec, local, measured, 2)
    assert eff == pytest.approx(doc["efficiency"], rel=1e-6)
    assert rows(spec, local, [2], eff)[0]["tokens_per_s_per_device"] == pytest.approx(measured, rel=1e-3)


def test_a_calibrated_compute_goes_through_the_schedule_unchanged():
    """schedule_step (advise's calibration through the project's rules): the simulated compute
    stream holds exactly the compute it was given; the step adds only exposed communication; a
    pipeline has no rules here (its flow shop is step.py's)."""
    from ddlbench.estimate.profile import profile
    from ddlbench.estimate.scale import Pricing, schedule_step
    from ddlbench.network import model
    from ddlbench.planning.config import plan_from_overrides
    plan = plan_from_overrides(["model=llama_tiny", "framework=fsdp_full", "launcher.nproc=8", "run.global_batch=16",
                                "run.device=cpu"])
    prof = profile(plan.cfg.model, "fp32", "cpu")
    pricing = Pricing(model.load("dgx_h100"))
    out = schedule_step(plan, prof, pricing, 0.25, "none", 8)
    assert out["compute_s"] == pytest.approx(0.25)
    assert out["step_s"] == pytest.approx(0.25 + sum(out["exposed"].values()))
    pipe = plan_from_overrides(["model=llama_tiny", "framework=pipeline_1f1b", "framework.options.pp=2",
                                "launcher.nproc=2", "run.micro_batch=1", "run.device=cpu"])
    assert schedule_step(pipe, prof, pricing, 0.25, "none", 8) is None


def test_fsdp2_planned_for_a_cpu_hides_nothing():
    """The same FSDP2 plan on a CPU (run.device=cpu: blocking collectives) and on a device with
    streams: the CPU's step is its compute plus every collective it prices; the other hides some."""
    from ddlbench.estimate.profile import profile
    from ddlbench.estimate.scale import Pricing, step_of
    from ddlbench.network import model
    from ddlbench.planning.config import plan_from_overrides
    pricing = Pricing(model.load("dgx_h100"))
    base = ["model=llama_tiny", "framework=fsdp_full", "launcher.nproc=8", "run.global_batch=16"]
    prof = profile(plan_from_overrides(base).cfg.model, "fp32", "cpu")
    cpu = step_of(plan_from_overrides([*base, "run.device=cpu"]), prof, pricing, 1e9, "none", 8)
    gpu = step_of(plan_from_overrides(base), prof, pricing, 1e9, "none", 8)
    assert cpu["compute_s"] == pytest.approx(gpu["compute_s"])
    assert cpu["step_s"] == pytest.approx(cpu["compute_s"] + sum(cpu["comm_s"].values()))
    assert gpu["step_s"] < cpu["step_s"]


def test_compute_per_piece_timed_on_the_device_at_hand(tmp_path):
    """calibrate=pieces: the embedding, a block (the model at 5 blocks less 1, over 4) and the head with
    the loss timed here; the schedule's compute at one device is exactly embedding + every block +
    head, forward and backward, at the micro-batch timed; at 8 tensor-parallel ranks each block
    takes its share of the FLOPs of that time."""
    from ddlbench.estimate.profile import profile
    from ddlbench.planning.config import plan_from_overrides
    out = tmp_path / "p"
    proc = bench("project", "model=llama_tiny", "framework=fsdp_full", "network=dgx_h100", "peak_tflops=1",
                 "calibrate=pieces", "local_batch=4", "run.micro_batch=4", "world_sizes=[1,8]", f"out={out}",
                 # the attention a CUDA device gets: its batches carry no mask (an H200's run of 2026-11-30
                 # ended "sdpa_causal builds no mask" before the timed batch left the mask out)
                 "model.attention=sdpa_causal")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "projection.json").read_text())
    assert doc["efficiency_source"].startswith("per piece, timed on this host's cpu at micro-batch 4")
    # the spawned processes (the profile, the framework's step) start as quietly as the command itself
    assert "is an Enum subclass" not in proc.stderr and "_pytree" not in proc.stderr, proc.stderr[-1000:]
    t = doc["pieces_timed_s"]
    assert set(t) == {"embedding", "block", "head"} and all(f > 0 and b > 0 for f, b in t.values())
    blocks = len(profile(plan_from_overrides(["model=llama_tiny"]).cfg.model).pieces) - 2
    rows = {r["devices"]: r for r in doc["rows"]}
    one = rows[1]
    # the run's optimizer timed too (AdamW, for-loop on CPU): per parameter stepped, after the schedule;
    # FSDP2 steps an eighth of the parameters on each of 8 ranks
    opt = doc["optimizer_timed"]
    params = plan_from_overrides(["model=llama_tiny"])
    n = profile(params.cfg.model).params
    assert opt["s_per_param"] > 0 and "optimizer step" not in doc["not_priced"]
    # the framework's own step (FSDP2 for rank 0 of 8 over a fake group, the smallest world asked above one rank,
    # the model at 5 blocks) against the
    # bare model's forward + backward and optimizer at that depth: every piece and the optimizer priced x factor
    fw = doc["framework_timed"]
    assert "error" not in fw, fw
    assert fw["factor"] == pytest.approx(fw["framework_step_s"] / fw["bare_step_s"]) and fw["world"] == 8
    assert fw["blocks"] == 5 and len(fw["framework_steps_s"]) == 5 and "fake process group" in fw["rule"]
    k = fw["factor"]
    assert f"x {k:.3f} for the framework's own step at 8 ranks" in doc["efficiency_source"]
    assert one["optimizer_s"] == pytest.approx(k * opt["s_per_param"] * n, rel=1e-9)
    assert rows[8]["optimizer_s"] == pytest.approx(one["optimizer_s"] / 8, rel=1e-9)
    assert one["compute_s"] == pytest.approx(k * (sum(t["embedding"]) + blocks * sum(t["block"]) + sum(t["head"]))
                                             + one["optimizer_s"], rel=1e-9)
    assert one["exposed_comm_s"] == 0


def test_a_framework_that_cannot_run_over_a_fake_group_keeps_the_bare_pieces_and_says_why():
    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.project.piece_timer import framework_factor
    plan = plan_from_overrides(["framework=pipeline_1f1b", "model=llama_tiny", "launcher.nproc=2"])
    got = framework_factor(plan, None, {}, {}, "cpu")
    assert set(got) == {"error"} and "point to point" in got["error"]


def test_tensor_parallel_collectives_by_hand_plain_sp_and_inside_pipeline_stages():
    """llama_tiny (2 blocks) at bf16, tp 2, micro-batch 2, on dgx_h100 (NVLink): a block's
    activations are seq x hidden elements a sample at 2 bytes (the profile counts 4 bytes an element).
    Plain DTensor TP all-reduces them 2 times in forward (row-wise outputs) and 5 in backward (q, k,
    v, gate, up); Megatron SP (`sequence_parallel`) all-gathers before attention and the MLP and
    reduce-scatters after, each way; under a pipeline each stage's blocks pay theirs in its slot."""
    from ddlbench.estimate.profile import cached_profile
    from ddlbench.estimate.scale import Pricing
    from ddlbench.network import model
    from ddlbench.planning.config import plan_from_overrides
    plan = plan_from_overrides(["model=llama_tiny", "framework=tensor_parallel_fsdp", "run.precision=bf16",
                                "launcher.nproc=8", "framework.options.tp=2", "run.device=cuda"])
    prof = cached_profile(plan.cfg.model, "bf16", "cuda")[0]
    act = 128 * 128 * 2 * 2                      # seq 128 x hidden 128 x 2 bytes x micro-batch 2
    assert prof.boundary_bytes_per_sample == 128 * 128 * 4 and prof.tp_all_reduces() == (2, 5)
    p = Pricing(model.load("dgx_h100"))
    ar, ag, rs = (p.seconds(k, act, 2, 1) for k in ("all_reduce", "all_gather", "reduce_scatter"))
    tp = ("framework=tensor_parallel_fsdp", "framework.options.tp=2", "run.micro_batch=2")
    plain = spec_rows(tp, sizes=(8,))[0]
    assert plain["comm_by_kind_s"]["all_reduce@nvlink"] == pytest.approx((2 + 5) * ar * 2, rel=1e-9)
    sp = spec_rows((*tp, "framework.options.sequence_parallel=true"), sizes=(8,))[0]
    # (FSDP2's parameter all-gathers over the 4 shard ranks are on NVLink too: the same in both)
    sp_tp = sp["comm_by_kind_s"]["all_gather@nvlink"] - plain["comm_by_kind_s"]["all_gather@nvlink"]
    assert "all_reduce@nvlink" not in sp["comm_by_kind_s"] and sp_tp == pytest.approx(2 * 2 * (ag + rs) * 2, rel=1e-6)
    assert sp["step_s"] < plain["step_s"]
    # pp 2 x tp 2 (no data parallelism: no gradient all-reduce), 4 micro-batches: each stage holds one
    # block; the busiest stage's slot carries its block's 7 all-reduces per micro-batch, exposed
    pipe = ("framework=pipeline_1f1b", "framework.options.pp=2", "framework.options.tp=2", "framework.options.dp=-1",
            "run.micro_batch=2", "model.tie_embeddings=false")     # no tied weight's all-reduce between the ends
    with_tp = spec_rows(pipe, local_batch=8, sizes=(4,))[0]
    assert (with_tp["layout"]["grad_accum"], with_tp["layout"]["tp"], with_tp["layout"]["dp_replicate"]) == (4, 2, 1)
    assert with_tp["comm_by_kind_s"]["all_reduce@nvlink"] == pytest.approx(7 * ar * 4, rel=1e-6)
    assert with_tp["exposed_by_kind_s"]["all_reduce@nvlink"] == pytest.approx(7 * ar * 4, rel=1e-6)
    assert with_tp["step_s"] >= with_tp["compute_s"] + 7 * ar * 4
    # with sequence parallelism in the stages (torchtitan's 405B recipe): the block's all-gathers and
    # reduce-scatters in the slot, and each boundary send carries 1/tp of the activation (its part of the sequence)
    sp_pipe = spec_rows((*pipe, "framework.options.sequence_parallel=true"), local_batch=8, sizes=(4,))[0]
    assert "all_reduce@nvlink" not in sp_pipe["comm_by_kind_s"]
    assert sp_pipe["exposed_by_kind_s"]["all_gather@nvlink"] == pytest.approx(2 * 2 * (ag + rs) * 4, rel=1e-6)
    send = p.seconds("send", act, 2, 2)
    assert send > p.seconds("send", act / 2, 2, 2) > 0
    assert with_tp["comm_by_kind_s"]["send@nvlink"] == pytest.approx(2 * send * 4, rel=1e-6)
    assert sp_pipe["comm_by_kind_s"]["send@nvlink"] == pytest.approx(2 * p.seconds("send", act / 2, 2, 2) * 4, rel=1e-6)


def test_the_attention_matmuls_at_their_own_rate_and_backward_by_hand():
    """attention_efficiency: a block's executed T x T matmuls (half the scores under the causal kernel)
    timed at their own rate, the rest at the efficiency's. At half the rate they take twice as long:
    the block's forward grows by exactly their time at the full rate; pieces without them do not.
    Backward: twice the linear layers, 2.5 times the fused kernel's attention (flash recomputes the
    scores: five T x T matmuls to the forward's two); full checkpointing adds the whole forward,
    selective_op half of the linear layers (torchtitan's per-op policy keeps the attention)."""
    from ddlbench.estimate.profile import cached_profile
    from ddlbench.estimate.scale import piece_times
    from ddlbench.planning.config import plan_from_overrides
    prof = cached_profile(plan_from_overrides(["model=llama_tiny", "framework=fsdp_full"]).cfg.model, "bf16", "cuda")[0]
    assert prof.fused_attention and prof.causal_skip == 0.5
    rate = 1e12
    same = piece_times(prof, 1, 2, rate, "none")
    slow = piece_times(prof, 1, 2, rate, "none", attention_flops_per_s=rate / 2)
    full = piece_times(prof, 1, 2, rate, "full", attention_flops_per_s=rate / 2)
    op = piece_times(prof, 1, 2, rate, "selective_op", attention_flops_per_s=rate / 2)
    last = len(prof.pieces) - 1
    for i, (p, (f0, _b0), (f1, b1), (f2, b2), (f3, b3)) in enumerate(zip(prof.pieces, same, slow, full, op)):
        attn = p.attention_flops * (1 - prof.causal_skip) * 2 / rate
        assert f1 == pytest.approx(f0 + attn, rel=1e-12) and f2 == f3 == f1
        linear = f1 - 2 * attn
        assert b1 == pytest.approx(2 * linear + 2.5 * 2 * attn, rel=1e-12)
        assert b2 == pytest.approx(b1 + (f1 if 0 < i < last else 0.0), rel=1e-12)
        assert b3 == pytest.approx(b1 + (linear / 2 if 0 < i < last else 0.0), rel=1e-12)
    assert prof.pieces[1].attention_flops > 0 and prof.pieces[0].attention_flops == 0
    at_rate = piece_times(prof, 1, 2, rate, "none", attention_flops_per_s=rate)
    assert [x for t in at_rate for x in t] == pytest.approx([x for t in same for x in t], rel=1e-12)
    eager = cached_profile(plan_from_overrides(["model=llama_tiny", "framework=fsdp_full"]).cfg.model, "bf16", "cpu")[0]
    assert not eager.fused_attention
    assert all(b == pytest.approx(2 * f, rel=1e-12) for f, b in piece_times(eager, 1, 2, rate, "none"))


def test_the_other_ops_bytes_at_the_memorys_rate_by_hand():
    """kernels=eager|fused with a ridge r (peak FLOP/s over the memory's bytes/s): each piece's forward grows by
    r x its moved bytes (the eager or fused count) x micro-batch over the compute rate, split by tp as its FLOPs
    are; backward moves twice the forward's (and full checkpointing moves them again); none, or r = 0, is the
    roofline without them. Every piece of llama_tiny moves bytes eagerly (its embedding's lookup, its blocks' norms
    and activations, its head's loss); fused, the embedding none (it has no matmul: its output is the first
    block's norm's input, counted there)."""
    from ddlbench.estimate.profile import cached_profile
    from ddlbench.estimate.scale import piece_times
    from ddlbench.planning.config import plan_from_overrides
    prof = cached_profile(plan_from_overrides(["model=llama_tiny", "framework=fsdp_full"]).cfg.model, "bf16", "cuda")[0]
    rate, r, tp, mb = 1e12, 295.0, 2, 2
    plain = piece_times(prof, tp, mb, rate, "none")
    assert piece_times(prof, tp, mb, rate, "none", ridge=r, kernels="none") == plain
    assert piece_times(prof, tp, mb, rate, "none", ridge=0.0, kernels="eager") == plain
    for kernels in ("eager", "fused"):
        moved = piece_times(prof, tp, mb, rate, "none", ridge=r, kernels=kernels)
        full = piece_times(prof, tp, mb, rate, "full", ridge=r, kernels=kernels)
        for i, (p, (f0, b0), (f1, b1), (_f2, b2)) in enumerate(zip(prof.pieces, plain, moved, full)):
            share = p.executed_flops(tp, prof.causal_skip) / p.executed_flops(1, prof.causal_skip) if p.flops else 1.0
            extra = r * p.moved_bytes(kernels) * share * mb / rate
            assert (p.moved_bytes(kernels) > 0) == (kernels == "eager" or i > 0) and f1 == pytest.approx(f0 + extra, rel=1e-12)
            assert b1 == pytest.approx(b0 + 2 * extra, rel=1e-12)
            assert b2 == pytest.approx(b1 + (f1 if 0 < i < len(prof.pieces) - 1 else 0.0), rel=1e-12)
    assert all(p.fused_bytes < p.memory_bytes for p in prof.pieces[1:-1])     # fusing a block's chains moves less


def test_the_framework_step_on_a_gpu_starts_in_a_spawned_process():
    """time_step on CUDA spawns its process (one forked from the fork server could not use the GPU: an
    H200, 2026-11-30); elsewhere it forks from the server. The spawned path ran on CPU by hand."""
    from ddlbench.project.collectives import start_method
    assert [start_method(d) for d in ("cuda", "cuda:0", "cpu")] == ["spawn", "spawn", "forkserver"]


def test_the_framework_step_builds_its_model_for_the_device_it_runs_on():
    """On CUDA the fake-group step's model runs SDPA (sdpa_causal: no T x T scores kept), as the pieces
    were timed; built for the CPU it ran eager attention there and ran out of memory (an H200,
    2026-11-30). Here: eager for the CPU, sdpa_causal for CUDA (built on the host, no GPU needed)."""
    import torch

    from ddlbench.planning.config import plan_from_overrides
    from ddlbench.project.collectives import model_for
    cfg = plan_from_overrides(["framework=fsdp_full", "model=llama_tiny"]).cfg
    impl = {d: model_for(cfg, torch.device(d)).build().net.config._attn_implementation for d in ("cpu", "cuda")}
    assert impl == {"cpu": "eager", "cuda": "sdpa_causal"}


def test_context_parallel_inside_pipeline_stages_by_hand():
    """pp 2 x cp 2 (llama_tiny, bf16, micro-batch 2, 4 micro-batches, no data parallelism) against pp 2
    alone: each rank computes half of every sequence (compute_s halved exactly); the busiest stage's slot
    carries its block's ring per micro-batch, exposed (the cp ranks' k and v gathered in forward and again
    in backward, their fp32 gradients passed round cp times); each boundary send is 1/cp of the activation;
    the parameters sharded over the cp ranks (torchtitan's fold) and half the activations: less memory."""
    from ddlbench.estimate.profile import cached_profile
    from ddlbench.estimate.scale import Pricing
    from ddlbench.network import model
    from ddlbench.planning.config import plan_from_overrides
    pipe = ("framework=pipeline_1f1b", "framework.options.pp=2", "framework.options.dp=-1", "run.micro_batch=2",
            "model.tie_embeddings=false")
    plain = spec_rows(pipe, local_batch=8, sizes=(2,))[0]
    cp = spec_rows((*pipe, "framework.options.cp=2"), local_batch=8, sizes=(4,))[0]
    assert (cp["layout"]["cp"], cp["layout"]["pp"], cp["layout"]["grad_accum"]) == (2, 2, 4)
    assert cp["compute_s"] == pytest.approx(plain["compute_s"] / 2, rel=1e-9)
    prof = cached_profile(plan_from_overrides(["model=llama_tiny", "framework=fsdp_full"]).cfg.model, "bf16", "cuda")[0]
    p = Pricing(model.load("dgx_h100"))
    act = 128 * 128 * 2 * 2                       # seq 128 x hidden 128 x 2 bytes x micro-batch 2
    part = act / 2 / 2 * 2 * prof.kv_heads / prof.attention_heads    # elements of a rank's k and v (1/cp of them)
    ring = 2 * p.seconds("all_gather", part * 2 * 2, 2, 1) + 2 * p.seconds("send", part * 4, 2, 1)
    assert cp["exposed_by_kind_s"]["all_gather@nvlink"] == pytest.approx(ring * 4, rel=1e-6)
    assert cp["comm_by_kind_s"]["send@nvlink"] == pytest.approx(2 * p.seconds("send", act / 2, 2, 2) * 4, rel=1e-6)
    assert plain["comm_by_kind_s"]["send@nvlink"] == pytest.approx(2 * p.seconds("send", act, 2, 1) * 4, rel=1e-6)
    assert cp["memory_per_rank_bytes"] < plain["memory_per_rank_bytes"]


@pytest.mark.parametrize("framework", ["pipeline_1f1b", "pipeline_fsdp"])
def test_several_schedules_a_step_each_fill_and_drain_by_hand(framework):
    """framework.options.n_microbatches below the step's micro-batches (NeMo Automodel's GA over a pipeline):
    8 micro-batches as 2 schedules of 4 cost what 1 schedule of 4 costs (a local batch of 4) plus one more
    schedule's body (its compute, bubble and exposed sends); the tail after the schedules (the reduction,
    exposed) once. Memory is the schedule's: 4 micro-batches in flight, as at a local batch of 4. FSDP2
    gathers and reduce-scatters once a schedule (twice the traffic); plain replicas all-reduce once."""
    base = (f"framework={framework}", "framework.options.pp=2", "run.micro_batch=1",
            *(("framework.options.dp_shard=-1",) if framework == "pipeline_fsdp" else ("framework.options.dp=-1",)))
    one = spec_rows((*base,), local_batch=4, sizes=(8,))[0]
    two = spec_rows((*base, "framework.options.n_microbatches=4"), local_batch=8, sizes=(8,))[0]
    whole = spec_rows((*base,), local_batch=8, sizes=(8,))[0]
    assert two["compute_s"] == pytest.approx(2 * one["compute_s"], rel=1e-9) == whole["compute_s"]
    bubble = one["exposed_by_kind_s"]["pipeline bubble"]
    assert two["exposed_by_kind_s"]["pipeline bubble"] == pytest.approx(2 * bubble, rel=1e-9)
    assert whole["exposed_by_kind_s"]["pipeline bubble"] == pytest.approx(bubble, rel=1e-9)    # one fill and drain
    sends = sum(v for k, v in one["exposed_by_kind_s"].items() if k.startswith("send@"))
    assert two["step_s"] - one["step_s"] == pytest.approx(one["compute_s"] + bubble + sends, rel=1e-9)
    assert two["memory_per_rank_bytes"] == pytest.approx(one["memory_per_rank_bytes"], rel=1e-12)
    gathered = {k: v for k, v in two["comm_by_kind_s"].items() if k.startswith(("all_gather", "reduce_scatter"))}
    if framework == "pipeline_fsdp":
        assert gathered and all(v == pytest.approx(2 * one["comm_by_kind_s"][k], rel=1e-9) for k, v in gathered.items())
    else:
        reduced = [k for k in one["comm_by_kind_s"] if k.startswith("all_reduce")]
        assert reduced and all(two["comm_by_kind_s"][k] == pytest.approx(one["comm_by_kind_s"][k]) for k in reduced)
    with pytest.raises(ConfigError, match="n_microbatches 3 must divide the step's"):
        spec_rows((*base, "framework.options.n_microbatches=3"), local_batch=8, sizes=(8,))
