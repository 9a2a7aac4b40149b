"""ddlbench/rank/hostevents.py: which step a host event fell in, a window's summary and whether the
collector explains its slowest step, by hand; the GC clock against a real full collection."""
import gc

import pytest

from ddlbench.rank.hostevents import GcClock, alloc_retries, slowest_step, step_of, summary


def test_step_of_places_an_instant_in_the_contiguous_window():
    steps = [0.5, 0.25, 1.0]          # the window starts at 10.0: steps end at 10.5, 10.75, 11.75
    assert step_of(9.99, 10.0, steps) is None
    assert step_of(10.0, 10.0, steps) == 0
    assert step_of(10.5, 10.0, steps) == 1        # a step's end is the next one's start
    assert step_of(11.7, 10.0, steps) == 2
    assert step_of(11.75, 10.0, steps) is None    # after the window


def test_summary_counts_in_window_collections_and_lists_the_long_ones():
    events = [(9.0, 2, 0.3),            # before the window (warm-up): not counted
              (10.1, 0, 0.0002),        # step 0, too short to list
              (10.6, 2, 0.25),          # step 1
              (10.7, 1, 0.002)]         # step 1 again
    out = summary(events, 10.0, [0.5, 0.25, 1.0], retries=3)
    assert out["gc"]["collections"] == {"0": 1, "1": 1, "2": 1}
    assert out["gc"]["per_step_s"] == [0.0002, 0.252, 0.0]
    assert out["gc"]["seconds"] == 0.0002 + 0.252
    assert out["gc"]["listed"] == [{"step": 1, "generation": 2, "s": 0.25}, {"step": 1, "generation": 1, "s": 0.002}]
    assert out["cuda_alloc_retries_in_loop"] == 3
    none = summary(events, None, [0.5], None)["gc"]                     # no window (epochs): nothing placed
    assert none["seconds"] == 0 and none["per_step_s"] == [] and none["collections"] == {"0": 0, "1": 0, "2": 0}


def test_slowest_step_says_whether_the_collector_explains_it():
    steps = [0.2, 0.2, 0.45, 0.2]       # median 0.2: step 2 is 0.25 s over
    rank = {"gc": {"per_step_s": [0.0, 0.0, 0.2, 0.0]}}
    quiet = {"gc": {"per_step_s": [0.0, 0.0, 0.01, 0.0]}}
    out = slowest_step(steps, 0.2, [quiet, rank])
    assert out["measured_step"] == 2 and abs(out["over_median_s"] - 0.25) < 1e-12
    assert out["gc_s"] == 0.2 and out["gc_explains"] is True        # 0.2 >= 0.25 / 2, on the rank that collected
    assert slowest_step(steps, 0.2, [quiet])["gc_explains"] is False
    assert slowest_step(steps, 0.2, [quiet, None]) is None          # a rank without events: no claim


def test_the_clock_sees_a_real_full_collection_and_lets_go():
    clock = GcClock().start()
    a = []
    a.append(a)                                   # a cycle only the cyclic collector frees
    del a
    gc.collect(2)
    events = clock.stop()
    assert clock._callback not in gc.callbacks
    assert any(gen == 2 and secs >= 0 for _, gen, secs in events)
    assert alloc_retries("cpu") is None


def test_freeze_takes_set_up_objects_out_of_every_collection_and_gives_them_back():
    """run.gc=freeze: what exists before the loop is frozen (collections skip it), the loop's own
    cycles are still collected automatically, and after the loop nothing stays frozen."""
    from ddlbench.rank.gcpolicy import GcPolicy
    made = [[i] for i in range(1000)]                       # set-up's objects
    policy = GcPolicy("freeze")
    policy.before_loop()
    try:
        assert gc.isenabled() and gc.get_freeze_count() >= 1000
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in tracked for o in made)    # a full collection no longer walks them
        later = [[]]
        policy.after_first_step()                           # what the first step made stays, frozen too
        assert id(later) not in {id(o) for o in gc.get_objects()}
        assert policy.record["frozen_objects"] >= policy.record["frozen_objects_before_loop"]
        assert not any(policy.in_step(s) for s in range(200))   # never collects inside a step itself
    finally:
        record = policy.after_loop()
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    assert record["policy"] == "freeze" and record["before_loop_s"] >= 0


def test_torchtitan_collects_generation_1_every_n_steps_with_automatic_collection_off():
    from ddlbench.rank.gcpolicy import GcPolicy
    policy = GcPolicy("torchtitan", every=50)
    policy.before_loop()
    try:
        assert not gc.isenabled()
        clock = GcClock().start()
        ran = [s for s in range(151) if policy.in_step(s)]
        events = clock.stop()
    finally:
        policy.after_loop()
    assert ran == [50, 100, 150]                  # torchtitan: step > 1 and step % gc_freq == 0
    assert [gen for _, gen, _ in events] == [1, 1, 1]
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_python_policy_changes_nothing_and_a_wrong_name_is_refused():
    from ddlbench.rank.gcpolicy import GcPolicy
    policy = GcPolicy("python")
    policy.before_loop()
    policy.after_first_step()
    assert gc.isenabled() and gc.get_freeze_count() == 0 and not policy.in_step(50)
    assert policy.after_loop() == {"policy": "python", "before_loop_s": policy.record["before_loop_s"],
                                   "inherited_frozen_objects": 0}
    with pytest.raises(ValueError, match="run.gc='off'"):
        GcPolicy("off")


def _in_a_forked_child(check) -> dict:
    """check() in a child started as the launcher starts agents and ranks (ddlbench.launch.forked):
    what it returned, as JSON through a pipe."""
    import json
    import os

    from ddlbench.launch.forked import Forked
    r, w = os.pipe()

    def child():
        os.write(w, json.dumps(check()).encode())
        return 0
    proc = Forked(child)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    assert proc.wait(timeout=60) == 0, out
    return json.loads(out)


def test_a_forked_child_starts_with_its_parents_objects_frozen_and_the_parent_keeps_its_own():
    """fork without exec (ddlbench/launch/forked.py): the child's collections skip what the parent made
    (the collection before a rank's loop walked and copied ~500,000 objects); the parent's collector is
    untouched. Policy `freeze` keeps the inherited objects frozen after the loop; `python` and
    `torchtitan` unfreeze them first, so their collections walk what a fresh interpreter's would."""
    from ddlbench.rank.gcpolicy import GcPolicy
    made = [[i] for i in range(5000)]                                     # noqa: F841 - the parent's objects
    assert gc.get_freeze_count() == 0

    def freeze_policy():
        from ddlbench.launch.forked import freeze_for_forked_ranks
        freeze_for_forked_ranks()               # as the agent does before torch forks its ranks
        inherited = gc.get_freeze_count()
        policy = GcPolicy("freeze")
        policy.before_loop()
        policy.after_first_step()
        record = policy.after_loop()
        return {"inherited": inherited, "after": gc.get_freeze_count(), "record": record}

    def python_policy():
        policy = GcPolicy("python")
        policy.before_loop()
        return {"after": gc.get_freeze_count(), "record": policy.after_loop()}

    frozen = _in_a_forked_child(freeze_policy)
    record = frozen["record"]
    assert frozen["inherited"] >= 5000 and record["inherited_frozen_objects"] == frozen["inherited"]
    # counted without walking the frozen objects: the inherited count plus what the rank froze itself
    assert frozen["after"] == record["frozen_objects"] >= record["frozen_objects_before_loop"] > frozen["inherited"]
    plain = _in_a_forked_child(python_policy)
    assert plain["after"] == 0 and plain["record"]["inherited_frozen_objects"] == 0   # no agent's count
    assert gc.get_freeze_count() == 0                     # the parent: nothing frozen


def test_the_collector_policy_is_a_parity_field(tmp_path):
    """Configurations alike but for run.gc: the parity table flags the odd ones (the user's setting);
    a record from before run.gc existed ran Python's thresholds and says so."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from reportdata import make_record, write

    from ddlbench import report
    root = tmp_path / "runs"
    for name, fw, policy in (("a", "ddp", "freeze"), ("b", "fsdp2", "freeze"), ("d", "deepspeed", "freeze"),
                             ("c", "horovod", "python"), ("old", "fairscale", None)):
        rec = make_record(name, framework=fw, sps=100.0)
        if policy:
            rec["config"]["run"]["gc"] = policy
        else:
            rec["config"]["run"].pop("gc", None)
        write(root, rec)
    rep = report.build([str(root)], tmp_path / "out", progress=False)
    assert {r.run_id: r.differs for r in rep.parity.itertuples() if r.differs} == {"c": ["gc"], "old": ["gc"]}
    assert dict(zip(rep.summary["run_id"], rep.summary["gc"])) == {"a": "freeze", "b": "freeze", "d": "freeze",
                                                                  "c": "python", "old": "python"}
