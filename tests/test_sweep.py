"""Sweeps: stable cell ids, manifest, local back end, status and resume; Slurm helpers."""
import json

import pytest
from conftest import bench

from ddlbench.errors import ConfigError
from ddlbench.launch.slurm import first_host, master_port, rank_env, task_threads, tasks_on_node
from ddlbench.sweep import manifest, status
from ddlbench.sweep.cells import expand
from ddlbench.sweep.slurm import array_spec


def test_cell_ids_are_stable_and_distinct():
    a = expand(["framework=ddp,fsdp_full", "launcher.nproc=1,2", "debug=fast"])
    b = expand(["framework=ddp,fsdp_full", "launcher.nproc=1,2", "debug=fast"])
    assert [c.id for c in a] == [c.id for c in b] and len({c.id for c in a}) == 4
    assert [c.index for c in a] == [0, 1, 2, 3]
    reps = expand(["framework=ddp", "debug=fast"], repeats=3)
    assert [c.repeat for c in reps] == [0, 1, 2] and len({c.id for c in reps}) == 3
    # repeats interleave: every configuration once, then each again
    both = expand(["framework=ddp,fsdp_full", "debug=fast"], repeats=2)
    assert [(c.overrides[0], c.repeat) for c in both] == [("framework=ddp", 0), ("framework=fsdp_full", 0),
                                                          ("framework=ddp", 1), ("framework=fsdp_full", 1)]
    # two spellings of one configuration are one cell
    assert len(expand(["launcher.nproc=2,2", "debug=fast"])) == 1


def test_bad_sweeps_fail_before_anything_is_written():
    with pytest.raises(ConfigError, match="unknown framework"):
        expand(["framework=ddp,nope"])
    with pytest.raises(ConfigError, match="run.dir is set per cell"):
        expand(["run.dir=/tmp/x"])


def test_array_spec():
    assert array_spec([0, 1, 2, 3], None) == "0-3"
    assert array_spec([1, 4, 7], 2) == "1,4,7%2"
    assert array_spec([5], None) == "5"


def test_slurm_rank_environment():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "1234",
           "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[03-05,09]"}
    out = rank_env(env)
    assert (out["RANK"], out["WORLD_SIZE"], out["LOCAL_RANK"]) == ("1", "2", "1")
    assert out["MASTER_ADDR"] == "gpu03"
    assert master_port(1234, 0) != master_port(1235, 0)          # array tasks on one node
    assert 20000 <= master_port(10 ** 7, 3) < 40000
    assert first_host("node7,node8") == "node7"
    with pytest.raises(ConfigError, match="must run under srun"):
        rank_env({})
    assert task_threads({"SLURM_CPUS_PER_TASK": "6"}) == 6


def test_slurm_local_world_size_is_this_nodes_task_count():
    """Node-aware strategies (DASO nodes, HSDP shard groups, intra/inter-node comm labels) read
    LOCAL_WORLD_SIZE; without it a multi-node srun looked like one node."""
    base = {"SLURM_PROCID": "5", "SLURM_NTASKS": "11", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "1",
            "SLURM_JOB_NODELIST": "gpu[01-03]", "SLURM_TASKS_PER_NODE": "4(x2),3"}
    assert rank_env({**base, "SLURM_NODEID": "1"})["LOCAL_WORLD_SIZE"] == "4"
    assert rank_env({**base, "SLURM_NODEID": "2"})["LOCAL_WORLD_SIZE"] == "3"
    assert tasks_on_node("8", 0) == 8 and tasks_on_node("2,1", 1) == 1
    with pytest.raises(ConfigError, match="SLURM_NODEID 3"):
        tasks_on_node("4(x2),3", 3)
    with pytest.raises(ConfigError, match="cannot parse"):
        tasks_on_node("4(y2)", 0)
    # without SLURM_TASKS_PER_NODE (not set by every srun): all tasks on one node
    no_tpn = {k: v for k, v in base.items() if k != "SLURM_TASKS_PER_NODE"}
    assert rank_env(no_tpn)["LOCAL_WORLD_SIZE"] == "11"


def test_horovod_slots_from_slurm():
    from ddlbench.launch.hvd_slurm import horovod_env, slots, tasks_per_node
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    table = slots([2, 1])
    assert [(s["rank"], s["node"], s["local_rank"], s["local_size"]) for s in table] == [(0, 0, 0, 2), (1, 0, 1, 2), (2, 1, 0, 1)]
    # local rank 1 exists on node 0 only: cross size 1; local rank 0 on both nodes
    assert [(s["cross_rank"], s["cross_size"]) for s in table] == [(0, 2), (0, 1), (1, 2)]
    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
           "SLURM_TASKS_PER_NODE": "2,1", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "HOROVOD_GLOO_IFACE": "eth0"}
    h = horovod_env(env, "gpu01")
    assert (h["HOROVOD_RANK"], h["HOROVOD_LOCAL_RANK"], h["HOROVOD_CROSS_RANK"], h["HOROVOD_SIZE"]) == ("2", "0", "1", "3")
    assert 40000 <= int(h["HOROVOD_GLOO_RENDEZVOUS_PORT"]) < 60000 and h["HOROVOD_GLOO_IFACE"] == "eth0"
    with pytest.raises(ConfigError, match="block task distribution"):
        horovod_env({**env, "SLURM_NODEID": "0"}, "gpu01")          # cyclic placement


def test_slurm_launcher_records_nodes_from_slurm(monkeypatch):
    from ddlbench.planning.config import plan_from_overrides
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_NNODES", "2")
    plan = plan_from_overrides(["launcher=slurm", "framework=fsdp_hybrid"])
    assert plan.dims.as_dict()["nodes"] == 2 and plan.dims.world_size == 8
    monkeypatch.delenv("SLURM_NNODES")
    assert plan_from_overrides(["launcher=slurm"]).dims.nodes == 1
    with pytest.raises(ConfigError, match="local launcher runs on one node"):
        plan_from_overrides(["launcher.nodes=2"])


def test_local_sweep_status_and_resume(tmp_path):
    sweep = tmp_path / "my sweep, it's v2"   # a space, a comma (a Hydra list) and a quote
    proc = bench("sweep", "--dir", str(sweep), "framework=ddp", "launcher.nproc=2", "debug=fast,fault_raise",
                 "logger=none", timeout=270)
    assert proc.returncode == 1, proc.stderr[-2000:]          # one cell failed
    cells = manifest.read(sweep)
    rows = {r["index"]: r for r in status.cell_states(sweep)}
    assert rows[0]["state"] == "ok" and rows[1]["state"] == "failed"
    assert "injected fault" in rows[1]["reason"]
    ok_result = sweep / cells[0].id / "result.json"
    before = ok_result.stat().st_mtime_ns
    proc = bench("sweep", "resume", str(sweep), timeout=270)
    assert "resuming 1 of 2 cells" in proc.stdout
    assert ok_result.stat().st_mtime_ns == before             # the ok cell was not rerun
    assert (sweep / ".attempts" / cells[1].id / "1" / "result.json").exists()   # old attempt kept aside
    proc = bench("sweep", "status", str(sweep))
    assert proc.returncode == 0 and "2 cells: 1 failed, 1 ok" in proc.stdout
    assert json.loads((sweep / "sweep.json").read_text())["backend"] == "local"


def test_sweep_cli_errors(tmp_path):
    proc = bench("sweep", "status", str(tmp_path))
    assert proc.returncode == 2 and "not a sweep directory" in proc.stderr
    proc = bench("sweep", "--dir", str(tmp_path / "logs_%A"), "debug=fast")
    assert proc.returncode == 2 and "'%' is not allowed in a sweep directory" in proc.stderr
    assert not (tmp_path / "logs_%A").exists()


def test_an_array_task_asks_slurm_for_its_cells_shape():
    from types import SimpleNamespace as L

    from ddlbench.sweep.slurm import Shape, cell_shape
    from ddlbench.sweep.task import srun_command
    # the local launcher: one task holding every rank, a CPU per rank
    assert cell_shape(L(name="local", nproc=4, nodes=1), 2) == Shape(1, 1, 8)
    # launcher=slurm: a task per rank on its nodes, started by srun inside the array task
    two = L(name="slurm", nproc=4, nodes=2)
    assert cell_shape(two, 1) == Shape(2, 4, 1)
    assert Shape(2, 4, 1).sbatch_args() == ["--nodes=2", "--ntasks=4", "--cpus-per-task=1"]
    cmd = srun_command(two, ["framework=ddp", "run.dir='/x'"])
    assert cmd[:4] == ["srun", "--nodes=2", "--ntasks=4", "--kill-on-bad-exit=1"]
    assert cmd[-4:] == ["ddlbench.cli", "run", "framework=ddp", "run.dir='/x'"]


def test_a_stopped_sweep_says_how_its_owner_goes_on(tmp_path, monkeypatch, capsys):
    """Issue 66: a stopped `bench advise` suggested `bench sweep resume <dir>/calibration`; a sweep
    started by advise names `bench advise resume <dir>`, a plain sweep its own resume."""
    from ddlbench.lifecycle.signals import Stopped
    from ddlbench.sweep import local, manifest
    from ddlbench.sweep.cells import Cell

    def stopped(sweep_dir, index):
        raise Stopped(15)
    monkeypatch.setattr(local, "run_cell", stopped)
    for name, meta, hint in (("plain", {}, "bench sweep resume {d}"),
                             ("advice/calibration", {"resume_command": "bench advise resume {p}"},
                              "bench advise resume {p}")):
        d = tmp_path / name
        meta = {k: v.format(p=d.parent) for k, v in meta.items()}
        manifest.create(d, [Cell(index=0, id="a", overrides=["run.seed=0"], repeat=0)],
                        {"backend": "local", "jobs": [], **meta})
        with pytest.raises(Stopped):
            local.run(d, [0])
        assert f"continue with `{hint.format(d=d, p=d.parent)}`" in capsys.readouterr().err
