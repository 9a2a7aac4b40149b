"""Tensor and pipeline parallelism in the cost models split what the adapters split: the blocks.
GPT-2's embedding and LM head stay whole on every tensor-parallel rank, and sit on the first and
the last pipeline stage (with a second copy of the tied embedding); dividing the whole model by
tp x pp (the rule before) was 27% optimistic at tp = 2 for gpt2_small and far more on a
real-vocabulary GPT-2 of few layers. Hand-made pieces by hand, then a real-vocabulary GPT-2's
profile against the parameters the adapters' own code puts on each rank."""
from __future__ import annotations

import pytest
from costs import cost_of

from ddlbench.adapters.cost import ModelProfile, Piece

# embedding 100 (50 of them the tied weight), 4 blocks of 200 (180 split by the tp plan), head 60
# (the tied 50 + 10); model: 100 + 800 + 60 - 50 = 910 parameters
EMBED = Piece(params=100, tied_params=50, flops=0.0, activation_bytes=10)
BLOCK = Piece(params=200, split_params=180, flops=1000.0, activation_bytes=100)
HEAD = Piece(params=60, tied_params=50, flops=400.0, activation_bytes=50)
PIECES = ModelProfile(params=910, largest_block_params=200, blocks=4, activation_bytes_per_sample=460,
                      checkpointed_bytes_per_sample=40, boundary_bytes_per_sample=8,
                      pieces=(EMBED, BLOCK, BLOCK, BLOCK, BLOCK, HEAD))


def test_tensor_parallel_splits_the_blocks_only():
    cost = cost_of("tensor_parallel", dp=1, tp=2, model=PIECES)
    # 100 + 4 x (20 + 180 / 2) + 60 - 50 (the tie held once)
    assert cost.piece == 550                      # the uniform rule said 910 / 2 = 455
    # FLOPs: a block keeps 1 - (1 - 1/2) x 180/200 = 0.55 of its 1000; the head all of its 400
    assert cost.compute_share == pytest.approx((4 * 550 + 400) / 4400)
    # activations: the blocks' halved, the embedding's and head's whole
    assert cost.activation_share == pytest.approx((10 + 4 * 50 + 50) / 460)


def test_a_fused_causal_kernel_computes_half_of_the_scores():
    """A block of 1000 forward FLOPs, 400 of them its T x T matmuls: eager attention computes all
    1000, a causal flash kernel 1000 - 400 / 2 = 800; at tp 2 the kept 550 shrinks in the same
    proportion (440); a piece without attention keeps its FLOPs."""
    block = Piece(params=200, split_params=180, flops=1000.0, attention_flops=400.0)
    assert block.executed_flops(1) == 1000.0 and block.executed_flops(1, 0.5) == 800.0
    assert block.executed_flops(2, 0.5) == pytest.approx(550.0 * 0.8)
    assert HEAD.executed_flops(1, 0.5) == 400.0


@pytest.mark.parametrize("framework, per_rank", [
    # 6 pieces into 2 stages: [embed b b | b b head]
    ("pipeline_gpipe", (100 + 400, 400 + 60)),
    ("pipeline_1f1b", (100 + 400, 400 + 60)),
    # 4 stages [embed b | b | b | b head]; looped: ranks 0 1 0 1
    ("pipeline_interleaved", (100 + 200 + 200, 200 + 200 + 60)),
    # V: ranks 0 1 1 0, rank 0 holds the embedding and the head: the tied weight once
    ("pipeline_zero_bubble", (100 + 200 + 200 + 60 - 50, 200 + 200)),
])
def test_pipeline_stages_hold_the_embedding_and_the_head(framework, per_rank):
    cost = cost_of(framework, dp=1, pp=2, mb=1, ga=4, model=PIECES)
    assert cost.piece == max(per_rank)


def test_pipeline_busiest_rank_compute_and_activations():
    cost = cost_of("pipeline_1f1b", dp=1, pp=2, mb=1, ga=4, model=PIECES)
    assert cost.compute_share == pytest.approx(max(2000, 2000 + 400) / 4400)
    # 1F1B: stage 0 holds 2 micro-batches in flight, the last stage 1: max(210 x 2, 250 x 1) / 2
    assert cost.in_flight == 2
    assert cost.activation_share == pytest.approx(max((10 + 200) * 2, (200 + 50) * 1) / 2 / 460)


def test_interleaved_holds_what_torchs_order_holds():
    """pp 2, 2 stages a rank, 4 micro-batches (2 rounds of 2). Rank 0 runs 4 forwards first (its
    second stage's first round, 2 more for its hop from the last rank), then forward-backward pairs:
    5 stage-micro-batches at the peak, 2.5 of its whole; rank 1 2 forwards first: 3, 1.5. Ranks hold
    [embed b | b] = 210 and [b | b head] = 250: max(210 x 2.5, 250 x 1.5) / 2.5 of 460."""
    from ddlbench.metrics.pipeline import interleaved_in_flight
    assert [interleaved_in_flight(r, 2, 2, 4) for r in (0, 1)] == [2.5, 1.5]
    assert interleaved_in_flight(0, 8, 2, 32) == (8 + 2 * 7 + 1) / 2       # 1F1B's first stage: 8
    cost = cost_of("pipeline_interleaved", dp=1, pp=2, mb=1, ga=4, model=PIECES)
    assert cost.in_flight == 2.5
    assert cost.activation_share == pytest.approx(max(210 * 2.5, 250 * 1.5) / 2.5 / 460)


def test_without_pieces_the_split_is_uniform():
    from costs import PROF
    assert cost_of("tensor_parallel", dp=1, tp=2).piece == PROF.params / 2
    cost = cost_of("pipeline_1f1b", dp=1, pp=2, mb=1, ga=4)
    assert (cost.piece, cost.compute_share, cost.activation_share) == (PROF.params / 2, 0.5, 0.5)


@pytest.fixture(scope="module")
def real_vocab():
    """gpt2_tiny's 2 blocks of width 128 with GPT-2's real vocabulary (50,257 tokens)."""
    from ddlbench.estimate.profile import profile
    from ddlbench.planning.config import plan_from_overrides
    cfg = plan_from_overrides(["model=gpt2_tiny", "model.vocab_size=50257"]).cfg.model
    return cfg, profile(cfg)


def test_profile_pieces_by_hand(real_vocab):
    cfg, prof = real_vocab
    d, t, v, blocks = cfg.n_embd, cfg.seq_len, cfg.vocab_size, cfg.n_layer
    embed, *body, head = prof.pieces
    assert len(body) == blocks
    assert embed.params == v * d + t * d and embed.tied_params == v * d and embed.flops == 0
    assert head.params == 2 * d + v * d and head.tied_params == v * d and head.split_params == 0
    assert head.flops == 2 * t * d * v                          # logits: one (t x d) @ (d x v) product
    # QKV 3d^2, projection d^2, MLP 4d^2 + 4d^2 per token; attention scores and mix 2 x t x d per token
    assert body[0].flops == 2 * t * 12 * d * d + 2 * 2 * t * t * d
    # c_attn and c_fc with their biases, c_proj twice without (row-wise biases stay whole)
    assert body[0].split_params == 3 * d * d + 3 * d + d * d + 4 * d * d + 4 * d + 4 * d * d
    assert sum(p.params for p in prof.pieces) - v * d == prof.params
    assert sum(p.activation_bytes for p in prof.pieces) == prof.activation_bytes_per_sample


TP_LOCAL = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from ddlbench.planning.config import plan_from_overrides
from ddlbench.models.registry import build
from ddlbench.models.tensor_parallel import apply_tensor_parallel
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
with torch.device("meta"):
    model = build(plan_from_overrides(["model=gpt2_tiny", "model.vocab_size=50257"]).cfg.model, "cpu").build()
apply_tensor_parallel(model, mesh)
print(sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters()))
"""


def test_tensor_parallel_piece_is_what_the_plan_leaves_on_a_rank(real_vocab):
    """The plan applied for real (DTensor on a fake 2-rank process group, in a process of its
    own: the fake group leaves autograd unable to run in processes forked after it): the
    parameters rank 0 holds equal the cost model's piece; the uniform rule said half of it."""
    import subprocess
    import sys

    from conftest import REPO
    proc = subprocess.run([sys.executable, "-c", TP_LOCAL], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    local = int(proc.stdout.split()[-1])
    cfg, prof = real_vocab
    cost = cost_of("tensor_parallel", dp=1, tp=2, model=prof)
    assert cost.piece == local
    assert local > 1.9 * prof.params / 2                    # the embedding and head dominate


@pytest.mark.parametrize("framework", ["pipeline_gpipe", "pipeline_interleaved", "pipeline_zero_bubble"])
def test_pipeline_piece_is_what_the_busiest_rank_holds(real_vocab, framework):
    """The model cut as the pipeline adapter cuts it (pieces, partition, stage owners): the most
    parameters any rank holds (a tie held twice on one rank once) equal the cost model's piece."""
    import torch
    from costs import variant

    from ddlbench.models.pipeline import partition, pieces, stage_owners
    from ddlbench.models.registry import build

    cfg, prof = real_vocab
    cls, options = variant(framework)
    v = cls(cls.Options(**options)).stages_per_rank()
    with torch.device("meta"):
        plist = pieces(build(cfg, "cpu").build())
    owners = stage_owners(options["schedule"], 2, v)
    held = [{} for _ in range(2)]
    for stage, r in enumerate(partition(len(plist), 2 * v)):
        for i in r:
            held[owners[stage]].update({id(p): p.numel() for p in plist[i].parameters()})
    busiest = max(sum(h.values()) for h in held)
    cost = cost_of(framework, dp=1, pp=2, mb=1, ga=4, model=prof)
    assert cost.piece == busiest
    assert busiest > 1.5 * prof.params / 2
