"""Config composition of every group option, and bad input -> exit 2 with one clear line."""
import pytest
from conftest import bench

from ddlbench.errors import ConfigError
from ddlbench.planning.config import GROUPS, group_options, plan_from_overrides

ALL_OPTIONS = [(g, o) for g in GROUPS if g != "run" for o in group_options(g)]


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    """Minimal on-disk datasets so path-taking options compose (ImageFolder: 10 classes)."""
    root = tmp_path_factory.mktemp("data")
    for split in ("train", "val"):
        for c in range(10):
            (root / "images" / split / f"c{c}").mkdir(parents=True)
    (root / "text").mkdir()
    for name in ("wiki.train.tokens", "wiki.valid.tokens"):
        (root / "text" / name).write_text("some text\n")
    return root


def needs(group: str, option: str, data_dirs) -> list[str]:
    """Companion overrides a group option needs to form a valid config on its own."""
    vision = ["model=resnet18_tiny"]
    return {("data", "blobs"): vision, ("data", "digits"): vision,
            ("data", "imagefolder"): vision + [f"data.path={data_dirs / 'images'}"],
            ("data", "text"): [f"data.path={data_dirs / 'text'}"],
            ("experiment", "seed_vgg16_imagenet"): [f"data.path={data_dirs / 'images'}", "model.num_classes=10"],
            ("experiment", "seed_gpt2_medium_wikitext103"): [f"data.path={data_dirs / 'text'}", "data.tokenizer=byte"],
            ("framework", "tensor_parallel_fsdp"): ["launcher.nproc=4"],   # tp 2 x dp_shard 2
            ("framework", "pipeline_fsdp"): ["launcher.nproc=4"],          # pp 2 x dp_shard 2
            # sequence parallelism: tp > 1 and a Llama-like family
            ("framework", "tensor_parallel_sp"): ["model=llama_tiny", "launcher.nproc=2"],
            ("framework", "deepspeed_ulysses"): ["model=llama_tiny", "model.attention=sdpa", "launcher.nproc=2"],
            ("framework", "context_parallel"): ["model=llama_tiny", "model.attention=sdpa_causal", "launcher.nproc=2"],
            # expert parallelism: a Mixture-of-Experts model (ep 2 x tp 2 takes 4 ranks)
            ("framework", "expert_parallel"): ["model=moe_tiny", "launcher.nproc=2"], ("framework", "deepspeed_moe"): ["model=moe_tiny", "launcher.nproc=2"],
            ("framework", "expert_parallel_tp"): ["model=moe_tiny", "launcher.nproc=4"],
            }.get((group, option), [])


@pytest.mark.parametrize("group,option", ALL_OPTIONS, ids=[f"{g}={o}" for g, o in ALL_OPTIONS])
def test_every_group_option_composes_and_validates(group, option, data_dirs):
    plan = plan_from_overrides([f"{group}={option}", *needs(group, option, data_dirs)])
    assert plan.dims.world_size == plan.cfg.launcher.nproc
    if group == "framework":  # files are <framework>[_<variant>]; fsdp_* run the fsdp2 adapter
        assert option.startswith(plan.cfg.framework.name.removesuffix("2"))
    elif group in ("model", "data", "optim", "launcher", "logger", "hardware"):
        assert getattr(plan.cfg, group).name == option


def test_variants_inherit_from_their_base():
    plan = plan_from_overrides(["framework=ddp_powersgd"])
    assert plan.options.comm_hook == "powersgd"
    assert plan.options.bucket_cap_mb == 25.0  # inherited from ddp.yaml
    assert plan.cfg.framework.variant == "powersgd"


def test_hardware_presets_resolve_peaks():
    plan = plan_from_overrides(["hardware=a100"])
    assert plan.cfg.hardware.peak_flops.bf16 == 312e12


def test_experiment_and_debug_are_global_packages():
    plan = plan_from_overrides(["experiment=ddp_tiny_scaling", "debug=fast"])
    assert plan.cfg.run.measure_steps == 3 and plan.cfg.logger.name == "none"
    assert plan_from_overrides(["debug=fault_kill"]).cfg.fault.kind == "kill"


BAD = [
    (["model=logreg", "data=digits"], "data.features=upscaled gives 3 channels; model.channels is 1"),
    (["model=resnet18_tiny", "data=digits", "data.features=raw"], "data.features=raw gives 1 x 8 x 8 inputs"),
    (["model=resnet18_tiny", "+model.channels=1"], "arch 'resnet18' takes 3 input channels"),
    (["experiment=convex_logreg", "run.target=0.5"], "data.val_fraction=0 leaves no validation split"),
    (["experiment=convex_logreg", "data.train_samples=1798"], "exceeds the 1797 training samples"),
    (["model=resnet18_tiny", "data=digits", "data.train_samples=1500"], "exceeds the 1438 training samples"),
    (["run.final_objective=true"], "run.final_objective is computed over a dataset's training split"),
    # issue 66: accepted, then ended at run.timeout_s with nothing measured
    (["run.min_window_s=1e9"], "run.min_window_s=1e+09 s cannot fit in run.timeout_s=900 s"),
    (["framework=fsdp_full", "framework.options.activation_checkpointing=selective_layer:99"],
     "activation_checkpointing=selective_layer:99 checkpoints none of gpt2_tiny's 2 blocks"),
    (["launcher.nproc=0"], "launcher.nproc: Input should be greater than 0"),
    (["launcher.nproc=3"], "run.global_batch 8 is not divisible by dp=3"),
    (["launcher.nproc=2", "run.micro_batch=3"], "dp ranks x run.micro_batch = 2 x 3"),
    (["framework=ddpp"], "unknown framework 'ddpp'; did you mean 'ddp'?"),
    (["model=gpt5"], "unknown model 'gpt5'"),
    (["run.mesure_steps=3"], "unknown config key 'run.mesure_steps'"),
    (["run.measure_steps=ten"], "run.measure_steps: Input should be a valid integer"),
    (["run.precision=fp4"], "run.precision: Input should be 'auto', 'fp32', 'bf16', 'fp16' or 'fp8'"),
    (["run.global_batch=-4"], "run.global_batch: Input should be greater than 0"),
    (["framework.options.comm_hook=zip"], "framework.options.comm_hook: Input should be"),
    (["framework.options.bucket_cap_mb=0"], "framework.options.bucket_cap_mb: Input should be greater than 0"),
    (["+framework.options.bucket_size=4"], "framework.options.bucket_size: unknown key"),
    (["model.n_head=5"], "n_embd 128 is not divisible by n_head 5"),
    (["hardware=tpu9"], "unknown hardware 'tpu9'"),
    (["run.timeout_s=0"], "run.timeout_s: Input should be greater than 0"),
    (["nonsense"], "cannot parse override 'nonsense'"),
    (["data=markov", "model=resnet18_tiny"], "data=markov is a language dataset but model=resnet18_tiny is a vision model"),
    (["data=digits"], "data=digits is an image dataset but model=gpt2_tiny is a language model"),
    (["run.epochs=2"], "data=synthetic is random noise"),
    (["data=markov", "run.target=2.0"], "run.eval_every and run.target apply to epoch training: set run.epochs"),
    (["data=imagefolder", "model=resnet18_tiny"], "data.path is required: set data.path=..."),
    (["data=imagefolder", "model=resnet18_tiny", "data.path=/no/such/dir"], "data.path: /no/such/dir/train is not a directory"),
    (["data=text", "data.path=/no/such"], "data.path: /no/such/wiki.train.tokens does not exist"),
    (["data=text", "data.path=/tmp", "data.tokenizer=gpt2"], "tokenizer gpt2 needs data.tokenizer_dir"),
    (["data=digits", "model=resnet18_tiny", "run.epochs=1", "run.target=1.1", "run.target_vs_floor=true"],
     "run.target_vs_floor needs run.target_metric=loss and a dataset with a known floor"),
    (["data=markov", "data.states=1000"], "data.states 1000 exceeds model.vocab_size 256"),
    (["data=markov", "data.train_samples=4"], "data.train_samples 4 is smaller than run.global_batch 8"),
    (["data=markov", "run.epochs=1", "run.target=1.5", "run.target_metric=accuracy"], "an accuracy target must be in (0, 1]"),
    (["data=markov", "data.concentration=0"], "data.concentration: Input should be greater than 0"),
    (["framework.adapter=os:system"], "framework.adapter 'os:system': only adapters in ddlbench.adapters may be named"),
    (["framework.adapter=ddlbench.adapters.common:split_micro"], "is not an adapter's Variant"),
    (["framework.adapter=ddlbench.adapters..x:Y"], "only adapters in ddlbench.adapters"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_config_raises_clear_error(overrides, message):
    with pytest.raises(ConfigError) as info:
        plan_from_overrides(overrides)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides,message", BAD[:4], ids=[" ".join(o) for o, _ in BAD[:4]])
def test_cli_exits_2_with_one_line_and_no_traceback(tmp_path, overrides, message):
    proc = bench("run", f"run.dir={tmp_path}/r", *overrides)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # nothing launched, nothing written


def test_dry_run_validates_without_launching(tmp_path):
    proc = bench("run", "launcher.nproc=2", "run.dry_run=true", f"run.dir={tmp_path}/r")
    assert proc.returncode == 0, proc.stderr
    assert '"world_size": 2' in proc.stdout and "nothing launched" in proc.stdout
    assert not (tmp_path / "r").exists()


# group choices, value overrides after them (in order: the later framework's options replace the earlier's),
# additions, deletions, a dict value on a group's name, a Hydra node override (composed the plain way)
@pytest.mark.parametrize("overrides", [
    ["model=llama_8b", "framework=fsdp_full", "model.n_layer=4", "run.micro_batch=3"],
    ["framework=ddp", "framework.options.bucket_cap_mb=50", "framework=fsdp_full"],
    ["model=gpt2_tiny", "+run.newkey=[1,2]", "~run.seed"],
    ["model=gpt2_tiny", "model.bogus=1"],
    ["~logger"],
    ["hydra.job.name=x", "model=gpt2_tiny"]])
def test_two_part_composition_is_hydras(overrides):
    """compose_raw composes a set of group choices once and applies the value overrides to a copy with
    Hydra's own code: the same config (or the same error) as Hydra composing everything at once."""
    from omegaconf import OmegaConf

    from ddlbench.planning import config

    def plain():
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException
        try:
            tree = config._compose_tree(tuple(overrides), config.CONF_DIR)
            return OmegaConf.to_container(tree, resolve=True, throw_on_missing=True)
        except (HydraException, OmegaConfBaseException) as exc:
            return ConfigError(config._hydra_message(exc))

    def two_part():
        try:
            config.compose_raw(overrides)
            config._COMPOSED.clear()       # composed again from the group choices' tree, which the first left unchanged
            return config.compose_raw(overrides)
        except ConfigError as exc:
            return exc

    want, got = plain(), two_part()
    assert type(got) is type(want) and (str(got) == str(want) if isinstance(want, ConfigError) else got == want)
