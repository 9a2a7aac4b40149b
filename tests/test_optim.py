"""ddlbench/adapters/optim.py: decay groups, the factory every adapter uses, the regularised objective; and
the raw digits features the convex yardstick trains on. Hand-computed values."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from ddlbench.adapters.optim import build_optimizer_factory, decays, param_groups, regularised_objective
from ddlbench.planning.config import plan_from_overrides


def test_decay_rule_reads_only_the_number_of_dimensions():
    assert decays(2, "bias_and_norm") and decays(4, "bias_and_norm")
    assert not decays(1, "bias_and_norm") and not decays(0, "bias_and_norm")
    assert decays(1, "none") and decays(0, "none")


def test_groups_split_biases_and_norms_from_matrices():
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Conv2d(1, 2, 3))
    groups = param_groups(model.parameters(), 0.1, "bias_and_norm")
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert [tuple(p.shape) for p in groups[0]["params"]] == [(4, 3), (2, 1, 3, 3)]
    assert [tuple(p.shape) for p in groups[1]["params"]] == [(4,), (4,), (4,), (2,)]
    # none: one group, everything decays; an empty group is never handed to torch
    assert [len(g["params"]) for g in param_groups(model.parameters(), 0.1, "none")] == [6]
    assert [g["weight_decay"] for g in param_groups([torch.zeros(2, 2)], 0.1, "bias_and_norm")] == [0.1]
    with pytest.raises(ValueError, match="no parameters"):
        param_groups([], 0.1, "none")


def test_factory_builds_the_configured_optimizer_with_groups():
    cfg = plan_from_overrides(["optim=sgd", "optim.weight_decay=0.5", "optim.exclude_from_decay=bias_and_norm"]).cfg.optim
    lin = nn.Linear(2, 1)
    opt = build_optimizer_factory(cfg)(lin.parameters())
    assert isinstance(opt, torch.optim.SGD)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]
    assert opt.param_groups[0]["momentum"] == cfg.momentum and opt.param_groups[0]["lr"] == cfg.lr
    # one SGD step from w = 1, b = 1 with zero gradient: only the weight shrinks (lr x wd x w)
    with torch.no_grad():
        lin.weight.fill_(1.0)
        lin.bias.fill_(1.0)
    lin.weight.grad, lin.bias.grad = torch.zeros_like(lin.weight), torch.zeros_like(lin.bias)
    opt.step()
    assert lin.weight.tolist() == [[pytest.approx(1 - cfg.lr * 0.5)] * 2] and lin.bias.item() == 1.0
    # groups a wrapper partitioned itself (FairScale OSS) pass through untouched
    made = param_groups(nn.Linear(2, 1).parameters(), 0.5, "bias_and_norm")
    assert [g["weight_decay"] for g in build_optimizer_factory(cfg)(made).param_groups] == [0.5, 0.0]


def test_regularised_objective_by_hand():
    # parameters: W (2-D, sum of squares 3.0), b (1-D, 2.0); mean loss 0.25, weight decay 0.1
    stats = [(2, [1.0, 3.0, 2.0]), (1, [0.0, 2.0, 1.0])]
    out = regularised_objective(0.25, stats, 0.1, "bias_and_norm")
    assert out["value"] == pytest.approx(0.25 + 0.05 * 3.0, abs=1e-15)
    assert out["decayed_sum_of_squares"] == 3.0
    assert regularised_objective(0.25, stats, 0.1, "none")["value"] == pytest.approx(0.25 + 0.05 * 5.0, abs=1e-15)


def test_raw_digits_are_the_8x8_pixels_over_16():
    from sklearn.datasets import load_digits

    from ddlbench.models.datasets import build_dataset
    plan = plan_from_overrides(["experiment=convex_logreg"])
    ds = build_dataset(plan.cfg.data, plan.cfg.model, 0)
    assert (ds.train.size, ds.val.size) == (1796, 0)
    batch = ds.train[[0, 1]]
    assert batch["images"].shape == (2, 1, 8, 8)
    first = int(__import__("numpy").random.default_rng(0).permutation(1797)[0])
    expected = torch.from_numpy(load_digits().images[first]).float() / 16
    assert torch.equal(batch["images"][0, 0], expected)
    assert batch["images"].min() >= 0 and batch["images"].max() <= 1


def test_logreg_is_one_linear_layer_on_the_flattened_input():
    from ddlbench import models
    plan = plan_from_overrides(["model=logreg"])
    model = models.build(plan.cfg.model).build()
    assert [tuple(p.shape) for p in model.parameters()] == [(10, 64), (10,)]
    x = torch.rand(3, 1, 8, 8)
    logits = model.net(x)
    assert torch.allclose(logits, x.reshape(3, 64) @ model.net.fc.weight.T + model.net.fc.bias)
    assert model.blocks() == []


def test_the_implementation_follows_the_device_unless_set():
    from ddlbench.adapters.optim import optimizer_impl
    assert (optimizer_impl("auto", "cuda"), optimizer_impl("auto", "cpu")) == ("fused", "for_loop")
    assert optimizer_impl("foreach", "cuda") == "foreach"
    cfg = plan_from_overrides(["optim=adamw"]).cfg.optim
    cuda = build_optimizer_factory(cfg, "cuda")
    assert cuda.impl == "fused" and cuda(nn.Linear(2, 1).parameters()).defaults["fused"] is True
    cpu = build_optimizer_factory(cfg, "cpu")
    assert cpu.impl == "for_loop" and cpu(nn.Linear(2, 1).parameters()).defaults["foreach"] is False
