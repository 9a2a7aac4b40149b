"""Bandwidth allocation across network dimensions (after LIBRA, Won et al. 2023): for a
workload on N devices, the per-device bandwidth of each dimension that

  objective=time           minimises the step time subject to a budget:
                           sum_i bw_i <= budget_GBps (bandwidth) or sum_i cost_i bw_i <= budget_cost;
  objective=perf_per_cost  maximises throughput per cost (minimises step time x (device_cost +
                           sum_i cost_i bw_i)), each bw_i within [min_GBps, max_GBps]. device_cost:
                           what a device costs besides its network, in the same units. Without
                           it (0) the product only falls as the bandwidths fall (step x cost
                           tends to the communication's bytes x cost), so the optimum is
                           min_GBps whenever compute is not free: a cluster is bought for its
                           devices, and the network's share of the price is what makes a
                           faster one worth it.

Solved with scipy's SLSQP from the equal split; collectives priced with one algorithm
(default hierarchical: smooth in the bandwidths). For the hierarchical all-reduce alone the
time-under-budget optimum has a closed form, bw_i proportional to sqrt(D_i / cost_i) with D_i
the bytes dimension i carries (Lagrange); tests/test_network.py checks SLSQP against it.
"""
from __future__ import annotations

import numpy as np

from ddlbench.network.model import GB, Network
from ddlbench.project.projection import comm_time
from ddlbench.project.workload import Workload


def _step(work: Workload, network: Network, devices: int, compute_s: float, bws_gbps, algorithm: str) -> float:
    net = network.with_bandwidths([max(b, 1e-6) * GB for b in bws_gbps])
    return compute_s + comm_time(work, net, devices, algorithm)[0]


def allocate(work: Workload, network: Network, devices: int, compute_s: float, objective: str = "time",
             budget_GBps: float | None = None, budget_cost: float | None = None,
             min_GBps: float = 0.1, max_GBps: float | None = None, algorithm: str = "hierarchical",
             device_cost: float = 0.0) -> dict:
    from scipy.optimize import minimize

    k = len(network.dims)
    costs = np.array([d.cost_per_GBps for d in network.dims])
    current = np.array([d.bandwidth / GB for d in network.dims])
    if objective == "time":
        if (budget_GBps is None) == (budget_cost is None):
            raise ValueError("objective=time needs exactly one of budget_GBps, budget_cost")
        if budget_cost is not None and not (costs > 0).all():
            raise ValueError("a cost budget needs cost_per_GBps > 0 on every dimension")
        weights = np.ones(k) if budget_GBps is not None else costs
        budget = budget_GBps if budget_GBps is not None else budget_cost
        x0 = budget / weights.sum() * np.ones(k)
        cons = [{"type": "ineq", "fun": lambda x: budget - weights @ x, "jac": lambda x: -weights}]
        bounds = [(min_GBps, max_GBps or budget / w) for w in weights]
        def fun(x):
            return _step(work, network, devices, compute_s, x, algorithm)
    elif objective == "perf_per_cost":
        if not (costs > 0).all():
            raise ValueError("perf_per_cost needs cost_per_GBps > 0 on every dimension")
        hi = max_GBps or float(current.max() * 4)
        x0, cons, bounds = np.clip(current, min_GBps, hi), [], [(min_GBps, hi)] * k
        def fun(x):
            return _step(work, network, devices, compute_s, x, algorithm) * (device_cost + float(costs @ x))
    else:
        raise ValueError("objective must be time or perf_per_cost")
    scale = fun(x0) or 1.0
    res = minimize(lambda x: fun(x) / scale, x0, method="SLSQP", bounds=bounds, constraints=cons,
                   options={"maxiter": 500, "ftol": 1e-12})
    best = np.clip(res.x, [b[0] for b in bounds], [b[1] for b in bounds])
    step_now = _step(work, network, devices, compute_s, current, algorithm)
    step_best = _step(work, network, devices, compute_s, best, algorithm)
    return {"objective": objective, "devices": devices, "algorithm": algorithm, "converged": bool(res.success),
            "message": str(res.message),
            "dimensions": [d.name for d in network.dims],
            "bandwidth_GBps": [float(b) for b in best], "current_GBps": [float(b) for b in current],
            "step_s": step_best, "step_s_current": step_now,
            "cost": float(costs @ best), "cost_current": float(costs @ current),
            "budget_GBps": budget_GBps, "budget_cost": budget_cost, "device_cost": device_cost}


def closed_form_split(carried_bytes: list[float], costs: list[float], budget: float) -> list[float]:
    """argmin sum_i D_i / bw_i subject to sum_i c_i bw_i = budget: bw_i = budget sqrt(D_i/c_i) / sum_j sqrt(D_j c_j)."""
    d, c = np.asarray(carried_bytes, float), np.asarray(costs, float)
    return list(budget * np.sqrt(d / c) / np.sqrt(d * c).sum())
