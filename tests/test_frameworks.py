"""Framework adapters beyond the gate: unsupported is a result, native configs are recorded,
sweeps over variants leave one result per cell."""
import importlib.util
import json

import pytest
from conftest import bench, for_runs, run_record

from ddlbench.planning.config import plan_from_overrides

FAST = ("run.warmup_steps=1", "run.measure_steps=2", "launcher.nproc=2")


@pytest.mark.parametrize("framework,package", [("deepspeed_zero2", "deepspeed"),
                                               ("fairscale_oss", "fairscale"),
                                               ("horovod", "horovod")])
def test_missing_package_is_an_unsupported_reason(monkeypatch, framework, package):
    plan = plan_from_overrides([f"framework={framework}"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    reason = plan.variant.unsupported_reason(plan.cfg, "cpu")
    assert reason and package in reason and ("install" in reason or "build" in reason)


def test_unsupported_variant_leaves_a_result_with_the_reason(run_dir):
    proc, rec = run_record(run_dir, "framework=fairscale_fsdp", *FAST)
    assert rec["status"] == "unsupported" and proc.returncode == 1
    assert "CUDA streams" in rec["error"]["message"]
    assert rec["parallel"]["world_size"] == 2


def test_deepspeed_records_its_config_json(run_dir):
    proc, rec = run_record(run_dir, "framework=deepspeed_zero3", *FAST)
    assert rec["status"] == "ok", rec["error"]
    ds = rec["framework"]["native_config"]["deepspeed_config"]
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["overlap_comm"] is True
    assert ds["train_batch_size"] == 8 and ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_clipping"] == 0.0
    # ZeRO-3: params, grads and Adam states all divided by N = 2 -> 16 bytes/param / 2
    assert rec["memory"]["model_state_bytes_per_rank_theory"] == 8 * rec["model"]["params"]
    assert {"all_gather", "reduce_scatter"} <= set(rec["comm"]["per_step_bytes"])


def test_fsdp2_counts_its_collectives_against_the_3psi_formula(run_dir):
    proc, rec = run_record(run_dir, "framework=fsdp_full", *FAST)
    assert rec["status"] == "ok", rec["error"]
    c, psi = rec["comm"], 4 * rec["model"]["params"]
    assert c["source"] == "c10d_dispatch"
    assert c["per_step_bytes"]["all_gather"] == 2 * psi and c["per_step_bytes"]["reduce_scatter"] == psi
    assert c["wire_bytes_per_rank"] == pytest.approx(c["analytic_wire_bytes_per_rank"])  # 3 Psi (N-1)/N
    assert rec["framework"]["native_config"]["fsdp_units"] == 3  # 2 blocks + root


def test_horovod_counts_its_own_allreduces_without_lr_scaling(run_dir):
    proc, rec = run_record(run_dir, "framework=horovod", *FAST)
    assert rec["status"] == "ok", rec["error"]
    assert rec["comm"]["source"] == "adapter"
    assert rec["comm"]["per_step_bytes"]["all_reduce"] == 4 * rec["model"]["params"]
    # when backward handed each gradient to Horovod: every byte, in issue order, headroom falling to ~0
    issued = rec["comm"]["issued"]["all_reduce"]
    assert sum(b for _, b in issued) == rec["comm"]["per_step_bytes"]["all_reduce"]
    heads = [h for h, _ in issued]
    assert all(h >= 0 for h in heads) and heads == sorted(heads, reverse=True) and heads[0] > heads[-1]
    assert all("issued" not in r["all_reduce"] for r in rec["comm"]["per_rank"])
    assert rec["framework"]["native_config"]["lr_scaled_by_world_size"] is False
    # horovodrun's commands had their ranks forked by the launcher's rank server (ddlbench/launch/rankserver.py),
    # which started from the launcher's imports, frozen
    for r in rec["timing"]["host_events"]["per_rank"]:
        assert r["gc_policy"]["inherited_frozen_objects"] > 10_000
    # what ran: Horovod 0.28.1's own default (operations.cc), which its cost model (advise) uses too
    from ddlbench.adapters.cost import ModelProfile
    from ddlbench.adapters.horovod import DEFAULT_FUSION_THRESHOLD_MB, Horovod
    from ddlbench.settings.dims import ParallelDims
    assert rec["framework"]["native_config"]["fusion_threshold_mb"] == DEFAULT_FUSION_THRESHOLD_MB == 128
    big = ModelProfile(params=10**9, largest_block_params=1, blocks=1, activation_bytes_per_sample=0,
                       checkpointed_bytes_per_sample=0, boundary_bytes_per_sample=0)
    cost = Horovod(Horovod.Options()).cost_model(ParallelDims(2, 2, 1, 1, 1, 1, 2), big, "fp32")
    assert cost.buffers["fusion buffer"] == DEFAULT_FUSION_THRESHOLD_MB << 20


def test_horovod_rank_failure_is_recorded(run_dir):
    proc, rec = run_record(run_dir, "framework=horovod", "debug=fault_raise", "launcher.nproc=2")
    assert rec["status"] == "failed"
    assert rec["error"]["rank"] == 1 and "injected fault" in rec["error"]["message"]


def test_multirun_leaves_one_result_per_cell(tmp_path):
    proc = bench("run", "-m", "framework=ddp,fsdp_grad_op", "launcher.nproc=1,2", "debug=fast",
                 f"run.dir={tmp_path}/sweep", timeout=for_runs(4))
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = sorted((tmp_path / "sweep").glob("*/result.json"))
    assert len(results) == 4
    seen = {(json.loads(p.read_text())["framework"]["name"], json.loads(p.read_text())["parallel"]["world_size"])
            for p in results}
    assert seen == {("ddp", 1), ("ddp", 2), ("fsdp2", 1), ("fsdp2", 2)}


def test_multirun_validates_every_cell_first(tmp_path):
    proc = bench("run", "-m", "launcher.nproc=1,3", f"run.dir={tmp_path}/sweep")
    assert proc.returncode == 2 and "not divisible by dp=3" in proc.stderr
    assert not (tmp_path / "sweep").exists()


def test_fairscale_oss_sdp_shards_optimizer_and_grads(run_dir):
    proc, rec = run_record(run_dir, "framework=fairscale_oss", *FAST)
    assert rec["status"] == "ok", rec["error"]
    params = rec["model"]["params"]
    # the cost model's (MemTracker-checked) model state: 4 B params and 4 B grads on every rank (OSS
    # zeroes gradients in place: each rank keeps all of them between steps), 8 B Adam states / N = 2
    assert rec["memory"]["model_state_bytes_per_rank_theory"] == 4 * params + 4 * params + 8 * params // 2
    c = rec["comm"]
    assert set(c["per_step_bytes"]) == {"reduce", "broadcast"}  # grads to owners, params back
    assert c["wire_bytes_per_rank"] == pytest.approx(c["analytic_wire_bytes_per_rank"])
    assert rec["framework"]["native_config"]["zero_grad_set_to_none"] is False


def test_horovod_killed_rank_is_named_as_the_cause(run_dir):
    proc, rec = run_record(run_dir, "framework=horovod", "debug=fault_kill", "launcher.nproc=2")
    assert rec["status"] == "failed"
    assert rec["error"]["rank"] == 1 and "without an error" in rec["error"]["message"]


def test_fairscale_fsdp_is_its_own_strategy_not_oss():
    """mode=fsdp used to fall through to OSS + DDP and then fail in describe() (KeyError 'fsdp').
    Its GPU-only setup cannot run here; what it records and claims is checked without it."""
    import torch

    from ddlbench.adapters.base import RankContext
    from ddlbench.errors import ConfigError
    from ddlbench.planning.config import plan_from_overrides
    plan = plan_from_overrides(["framework=fairscale_fsdp", "launcher.nproc=2"])
    ctx = RankContext(rank=0, local_rank=0, world_size=2, device=torch.device("cuda", 0), backend="nccl",
                      precision="fp32")
    adapter = plan.variant.strategy_class()(plan.variant, ctx, plan.dims)
    adapter.version, adapter.params = "0.4.13", 1000      # what setup() would have set
    native = adapter.describe()["native_config"]
    assert native["wrapper"].startswith("fairscale.nn.FullyShardedDataParallel") and native["flatten_parameters"]
    # ZeRO-3 accounting: everything sharded; 2 all-gathers + 1 reduce-scatter of Psi per step
    from ddlbench.adapters.variant import model_state_theory
    assert model_state_theory(plan.variant, plan.dims, "fp32", 1000, "adamw") == 1000 * (4 + 4 + 8) // 2
    assert plan.variant.analytic_comm(plan.dims, "fp32", 1000).payload_psi == {"all_gather": 2.0, "reduce_scatter": 1.0}
    with pytest.raises(ConfigError, match="flatten_parameters=false"):
        plan_from_overrides(["framework=fairscale_fsdp", "launcher.nproc=2", "optim.exclude_from_decay=bias_and_norm"])


def test_what_launchers_preload_before_forking_cpu_ranks_starts_no_thread():
    """ddlbench/launch/starters.py imports, once before forking CPU ranks, the variant's framework
    (DeepSpeed and the Muon module its engines import at initialize) and, under run.compile, torch's
    compiler. A module that started a thread at import would hang the forked ranks
    (ddlbench/launch/forked.py): a fresh interpreter counts its threads before and after."""
    import sys

    from conftest import run_bounded

    from ddlbench.launch.starters import preload_modules
    from ddlbench.planning.config import plan_from_overrides
    ds = plan_from_overrides(["framework=deepspeed_zero2", "run.compile=true"])
    modules = preload_modules(ds)
    assert {"deepspeed", "deepspeed.runtime.zero.muon.muon_optimizer", "torch._inductor.compile_fx"} <= set(modules)
    assert "deepspeed" not in preload_modules(plan_from_overrides(["framework=ddp"]))
    code = ("import os, importlib, torch; from ddlbench.rank import runner; "
            "before = len(os.listdir('/proc/self/task')); "
            f"[importlib.import_module(m) for m in {list(modules)!r}]; "
            "print(before, len(os.listdir('/proc/self/task')))")
    out = run_bounded([sys.executable, "-c", code], 120, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = map(int, out.stdout.split()[-2:])
    assert after == before, f"{after - before} thread(s) started by importing {modules}"
