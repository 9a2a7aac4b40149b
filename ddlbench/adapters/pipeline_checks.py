"""What a pipeline variant's options must satisfy before anything is built (ddlbench/adapters/pipeline.py
asks): the schedule's stages per rank and micro-batches, the model's fit to the stages, and what each
parallelism inside the stages needs (sequence and loss parallel, experts, context parallel)."""
from __future__ import annotations

from dataclasses import replace

from ddlbench.adapters.stages import schedule_microbatches
from ddlbench.adapters.tensor_parallel import loss_parallel_config_errors, sequence_parallel_errors
from ddlbench.errors import ConfigError
from ddlbench.settings.dims import model_fit_errors


def check_pipeline(options, cfg, dims, v: int) -> None:
    """Raise ConfigError with every reason these options cannot run (v: stages per rank)."""
    moe = getattr(cfg.model, "moe", None)
    if moe is not None and moe.aux_loss_coef > 0:
        raise ConfigError("pipeline stages pass hidden states, and the last stage's loss is the cross-entropy: "
                          "the router's load-balancing loss (model.moe.aux_loss_coef "
                          f"{moe.aux_loss_coef:g}) cannot be added; set model.moe.aux_loss_coef=0 or use "
                          "another framework")
    if options.schedule in ("gpipe", "1f1b") and v != 1:
        raise ConfigError(f"framework.options.stages_per_rank {v}: schedule {options.schedule} runs one "
                          "stage per rank (use interleaved_1f1b or interleaved_zero_bubble)")
    if options.schedule == "zbv_zero_bubble" and options.stages_per_rank not in (1, 2):
        raise ConfigError("framework.options.stages_per_rank: zbv_zero_bubble places exactly 2 stages per rank")
    if options.schedule in ("interleaved_1f1b", "interleaved_zero_bubble") and v < 2:
        raise ConfigError(f"framework.options.stages_per_rank must be >= 2 for {options.schedule}")
    if dims.dp_shard * dims.cp > 1 and options.schedule in ("interleaved_zero_bubble", "zbv_zero_bubble"):
        raise ConfigError(f"framework.options.dp_shard {dims.dp_shard} x cp {dims.cp}: FSDP2 inside the stages runs under the "
                          "gpipe, 1f1b and interleaved_1f1b schedules; the zero-bubble schedules split backward "
                          "into input and weight passes, which this adapter does not drive with FSDP2")
    if options.n_microbatches is not None and cfg.run.micro_batch is not None \
            and dims.grad_accum % options.n_microbatches:
        raise ConfigError(f"framework.options.n_microbatches {options.n_microbatches} must divide the step's "
                          f"{dims.grad_accum} micro-batches (run.micro_batch {cfg.run.micro_batch}): the schedule "
                          "runs grad_accum / n_microbatches times a step")
    # the schedule's own micro-batches against the pipeline's depth
    errors = model_fit_errors(replace(dims, grad_accum=schedule_microbatches(options, dims)[0]), cfg.model,
                              dims.pp * v, options.schedule)
    if options.sequence_parallel:
        errors += sequence_parallel_errors(cfg.model, dims.tp)
    if options.loss_parallel:
        errors += loss_parallel_config_errors(cfg.model, dims.tp)
    if options.ep > 1:
        from ddlbench.adapters.expert_parallel import moe_errors
        sharded = dims.dp_shard > 1
        errors += moe_errors(cfg.model, options.ep, dims.dp_shard if sharded else dims.dp_replicate,
                             "dp_shard (FSDP2 inside the stages)" if sharded else "dp (the pipeline's replicas)")
        if (sharded and dims.dp_replicate > 1) or dims.tp > 1:
            errors.append(f"framework.options.ep {options.ep} inside pipeline stages runs over plain replicas or over "
                          "dp_shard (FSDP2), with tp 1, for now (not over HSDP's dp_replicate x dp_shard)")
    if options.cp > 1:
        from ddlbench.adapters.stage_context import context_stage_errors
        from ddlbench.models.language import attention_impl
        errors += context_stage_errors(cfg, options, dims, attention_impl(
            getattr(cfg.model, "attention", "auto"), "cuda" if cfg.run.device == "cuda" else "cpu"))
    if errors:
        raise ConfigError("; ".join(errors))
