"""run.micro_batch=auto: the largest micro-batch the memory estimator says fits the device (with
HEADROOM), the global batch kept by accumulation, the choice and its reason in the record."""
from __future__ import annotations

import json

import pytest
from conftest import run_record

from ddlbench.errors import ConfigError
from ddlbench.planning.config import plan_from_overrides
from ddlbench.planning.microbatch import HEADROOM, GiB, memory_fraction, pick


def test_pick_by_hand():
    estimates = [(8, 100), (4, 60), (2, 40), (1, 30)]
    assert pick(estimates, 70)[0] == 4            # budget 0.9 x 70 = 63: 8 needs 100, 4 needs 60
    assert pick(estimates, 200)[0] == 8
    mb, why = pick(estimates, 20)                   # nothing fits: the smallest, saying so
    assert mb == 1 and why.startswith("none fits")
    with pytest.raises(ConfigError):
        pick([], 70)


@pytest.mark.parametrize("framework,model", [("ddp", "gpt2_tiny"), ("fsdp_full", "llama_tiny")])
def test_the_next_size_up_would_not_fit(framework, model):
    plan = plan_from_overrides([f"framework={framework}", f"model={model}", "launcher.nproc=2", "run.global_batch=16",
                                "run.micro_batch=auto", "run.device_memory_gb=0.025"])
    auto = plan.choices["micro_batch_auto"]
    est, budget = auto["estimates_bytes"], (1 - HEADROOM) * 0.025 * GiB
    mb = plan.dims.micro_batch
    assert auto["chosen"] == mb and auto["device_memory_source"] == "run.device_memory_gb"
    assert est[str(mb)] <= budget < est[str(2 * mb)], est     # it fits; twice it does not
    assert plan.dims.micro_batch * plan.dims.grad_accum * plan.dims.dp == 16   # the global batch kept
    assert plan.raw["run"]["micro_batch"] == "auto"                          # what was asked


def test_memory_fraction_caps_a_gpu():
    assert memory_fraction(40 * GiB, 80 * GiB) == 0.5 and memory_fraction(None, 80 * GiB) is None
    with pytest.raises(ConfigError, match="exceeds"):
        memory_fraction(100 * GiB, 80 * GiB)


def test_a_run_records_the_choice(tmp_path):
    _, rec = run_record(tmp_path / "r", "framework=ddp", "model=gpt2_tiny", "launcher.nproc=1", "run.global_batch=8",
                        "run.warmup_steps=1", "run.measure_steps=2", "run.micro_batch=auto", "run.device_memory_gb=0.02",
                        "run.comm_profile=false")
    assert rec["status"] == "ok", rec["error"]
    auto = rec["parallel"]["micro_batch_auto"]
    assert rec["parallel"]["micro_batch"] == auto["chosen"] < 8 and "fits" in auto["why"]
    assert rec["parallel"]["grad_accum"] == 8 // auto["chosen"] and rec["config"]["run"]["micro_batch"] == "auto"


def test_fused_attention_saves_no_scores_by_hand():
    import torch

    from ddlbench.estimate.profile import _saver, attention_scores
    assert attention_scores((2, 4, 16, 16), 16) and not attention_scores((2, 16, 32), 16)
    assert not attention_scores((2, 4, 16, 16), None) and not attention_scores((16, 16), 16)
    assert not attention_scores((2, 16, 16), 16)       # hidden states whose width equals T
    saved: dict = {}
    pack = _saver(set(), saved, fused_attention_len=16)
    pack(torch.empty(2, 4, 16, 16).view(8, 16, 16))    # a view of the scores: its storage decides
    pack(torch.empty(2, 16, 16))
    assert sum(saved.values()) == 2 * 16 * 16 * 4


def test_profile_for_cuda_leaves_out_what_eager_attention_saves():
    """llama_tiny (2 layers, 4 heads, T=128) built for CUDA runs SDPA: the profile leaves out
    eager attention's softmax output in fp32 and its bf16 copy, one each per layer (found on an
    H200: with them Llama 1B's estimate was 2x the measured peak). Its vocabulary (256) is a
    multiple of 64, so padding changes nothing here."""
    from ddlbench.estimate.profile import profile
    mc = plan_from_overrides(["model=llama_tiny"]).cfg.model
    cpu, gpu = profile(mc, "bf16", "cpu"), profile(mc, "bf16", "cuda")
    assert cpu.activation_bytes_per_sample - gpu.activation_bytes_per_sample == 2 * 4 * 128 * 128 * (4 + 2)
    # autocast frameworks: the same model measured in fp32, above the bf16 figure
    assert gpu.autocast_activation_bytes_per_sample > gpu.activation_bytes_per_sample > 0
    assert profile(mc, "fp32", "cuda").autocast_activation_bytes_per_sample == 0


def test_autocast_frameworks_take_the_fp32_activation_figures_by_hand():
    from ddlbench.adapters.cost import CostModel, ModelProfile, autocast_copies
    from ddlbench.estimate.memory import Layout, activation_bytes
    prof = ModelProfile(params=100, largest_block_params=10, blocks=4, activation_bytes_per_sample=1000,
                        checkpointed_bytes_per_sample=100, boundary_bytes_per_sample=0,
                        autocast_activation_bytes_per_sample=1800, autocast_checkpointed_bytes_per_sample=150)
    mixed, cast = CostModel("autocast", piece=100, buffers=autocast_copies(100, "bf16")), CostModel("cast", piece=100)
    assert mixed.autocast and not cast.autocast and not CostModel("fp32", piece=100,
                                                                  buffers=autocast_copies(100, "fp32")).autocast
    lay = Layout(framework="ddp", dp=1, micro_batch=2)
    assert activation_bytes(lay, prof, mixed) == 2 * 1800 and activation_bytes(lay, prof, cast) == 2 * 1000
    ck = Layout(framework="ddp", dp=1, micro_batch=2, checkpointing=True)
    assert activation_bytes(ck, prof, mixed) == 2 * (150 + 1800 / 4)


def test_a_rank_takes_the_launchers_choice_instead_of_profiling_again(monkeypatch):
    """run.micro_batch=auto is decided once, at validation in the launcher (choices.json); a rank
    re-validating config.json takes it (the profile of a 1B model costs seconds per rank)."""
    import ddlbench.planning.microbatch
    from ddlbench.planning.config import compose_raw, validate
    raw = compose_raw(["framework=ddp", "model=gpt2_tiny", "launcher.nproc=2", "run.global_batch=16",
                       "run.micro_batch=auto", "run.device_memory_gb=0.025"])
    launcher = validate(raw)
    monkeypatch.setattr(ddlbench.planning.microbatch, "choose", lambda *a, **k: (_ for _ in ()).throw(AssertionError("profiled")))
    rank = validate(raw, launcher.choices["micro_batch_auto"])
    assert rank.dims == launcher.dims and rank.choices == launcher.choices
    assert rank.raw["run"]["micro_batch"] == "auto"      # the record still says what was asked


def test_a_sweeps_memory_profile_is_computed_once_per_key(tmp_path, monkeypatch):
    """run.micro_batch=auto's profile (ddlbench/estimate/profile.py): once per key in a process, and in
    the sweep's cache on disk for the cells that are not forked from it; an unchanged key is not
    measured again, a changed key (precision, model) is; a damaged cache file is measured again."""
    import ddlbench.estimate.profile as prof_mod
    from ddlbench.planning.config import plan_from_overrides
    measured = []
    real = prof_mod.profile
    monkeypatch.setattr(prof_mod, "profile", lambda *a: measured.append(a) or real(*a))
    monkeypatch.setattr(prof_mod, "_memo", {})
    cfg = plan_from_overrides(["model=gpt2_tiny"]).cfg
    first, how = prof_mod.cached_profile(cfg.model, "fp32", "cpu", cache_dir=tmp_path)
    assert how.startswith("measured, cached in") and len(measured) == 1
    again, how = prof_mod.cached_profile(cfg.model, "fp32", "cpu", cache_dir=tmp_path)
    assert how.startswith("computed earlier in this process") and len(measured) == 1 and again == first
    prof_mod._memo.clear()       # another process (a Slurm array task): the disk cache
    again, how = prof_mod.cached_profile(cfg.model, "fp32", "cpu", cache_dir=tmp_path)
    assert how.startswith("cached ") and len(measured) == 1 and again == first
    prof_mod.cached_profile(cfg.model, "bf16", "cpu", cache_dir=tmp_path)          # another precision
    other = plan_from_overrides(["model=gpt2_tiny", "model.n_layer=3"]).cfg.model   # another model
    prof_mod.cached_profile(other, "fp32", "cpu", cache_dir=tmp_path)
    assert len(measured) == 3 and len(list(tmp_path.glob("profile-*.json"))) == 3
    prof_mod._memo.clear()
    for f in tmp_path.glob("profile-*.json"):
        f.write_text('{"key": "x", "prof')                                          # damaged: measured again
    prof_mod.cached_profile(cfg.model, "fp32", "cpu", cache_dir=tmp_path)
    assert len(measured) == 4


def test_a_cache_file_of_another_key_is_not_used_and_an_unusable_cache_is_skipped(tmp_path, monkeypatch, capsys):
    """Issue 66 (3, 9): llama_tiny's profile under gpt2_tiny's name made gpt2_tiny run llama_tiny's
    micro-batch; the key stored inside the file is compared now. A cache directory that cannot be
    made (a file in its place) is skipped with a warning: it saves time, it never fails a run."""
    import json

    import ddlbench.estimate.profile as prof_mod
    from ddlbench.planning.config import plan_from_overrides
    monkeypatch.setattr(prof_mod, "_memo", {})
    gpt2 = plan_from_overrides(["model=gpt2_tiny"]).cfg.model
    llama = plan_from_overrides(["model=llama_tiny"]).cfg.model
    own, _ = prof_mod.cached_profile(gpt2, "fp32", "cpu", cache_dir=tmp_path / "a")
    prof_mod.cached_profile(llama, "fp32", "cpu", cache_dir=tmp_path / "b")
    [g], [lf] = (tmp_path / "a").glob("profile-*.json"), (tmp_path / "b").glob("profile-*.json")
    g.write_text(lf.read_text())                           # llama's file under gpt2's name
    prof_mod._memo.clear()
    again, how = prof_mod.cached_profile(gpt2, "fp32", "cpu", cache_dir=tmp_path / "a")
    assert again == own and how.startswith("measured") and "not used (" in how and "holds the profile of key" in how
    assert "memory-profile cache:" in capsys.readouterr().err
    assert json.loads(g.read_text())["key"] == prof_mod.cache_key(gpt2, "fp32", "cpu")   # rewritten with its own
    (tmp_path / "file").write_text("not a directory")
    prof_mod._memo.clear()
    prof, how = prof_mod.cached_profile(gpt2, "fp32", "cpu", cache_dir=tmp_path / "file" / "cache")
    assert prof == own and how.startswith("measured; cache not cached: ")
    assert "bench: warning: memory-profile cache: not cached:" in capsys.readouterr().err


def test_a_sweeps_cells_share_the_profile(tmp_path):
    """A 2-cell run.micro_batch=auto sweep: the model is profiled once for the whole sweep."""
    from conftest import bench
    proc = bench("run", "-m", "debug=fast", "launcher.nproc=1", "logger=none", "run.micro_batch=auto",
                 "run.seed=0,1", f"run.dir={tmp_path / 's'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the sweep validated both cells (profiling once) before it forked them: neither cell profiles
    sources = [json.loads(p.read_text())["parallel"]["micro_batch_auto"]["profile_source"]
               for p in sorted((tmp_path / "s").glob("*/result.json"))]
    assert len(sources) == 2 and all(s.startswith("computed earlier in this process") for s in sources), sources
    # and left it on disk for cells in other processes (Slurm array tasks)
    assert len(list((tmp_path / "s" / ".cache" / "profiles").glob("profile-*.json"))) == 1
