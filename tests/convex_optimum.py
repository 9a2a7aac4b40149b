"""The optimum of experiment=convex_logreg, in float64, by two independent solvers; prints JSON.

L2-regularised multinomial logistic regression on digits' raw pixels / 16: mean cross-entropy
+ LAMBDA/2 |W|^2, bias not penalised. The data selection is re-done here from sklearn (seeded
permutation, first TRAIN samples), not taken from ddlbench. Run by tests/test_convex.py in a
child interpreter.
"""
from __future__ import annotations

import json

import numpy as np

LAMBDA = 0.01        # conf/experiment/convex_logreg.yaml optim.weight_decay
TRAIN = 1796         # its data.train_samples (val_fraction 0, split_seed 0)


def data() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))[:TRAIN]
    return d.images.reshape(len(d.target), -1)[order] / 16.0, d.target[order]


def objective(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """The objective and its gradient; w = [W (10 x 64) row-major, b (10)]."""
    n, k = len(y), 10
    weight, bias = w[:-k].reshape(k, x.shape[1]), w[-k:]
    z = x @ weight.T + bias
    z -= z.max(1, keepdims=True)
    lse = np.log(np.exp(z).sum(1))
    p = np.exp(z - lse[:, None])
    value = (lse - z[np.arange(n), y]).mean() + LAMBDA / 2 * (weight * weight).sum()
    p[np.arange(n), y] -= 1
    grad_w = p.T @ x / n + LAMBDA * weight
    return value, np.concatenate([grad_w.ravel(), p.mean(0)])


def main() -> None:
    import scipy.optimize
    from sklearn.linear_model import LogisticRegression

    x, y = data()
    res = scipy.optimize.minimize(objective, np.zeros(x.shape[1] * 10 + 10), args=(x, y), jac=True,
                                  method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 1e-16, "maxiter": 10000})
    # scikit-learn minimises C * sum(CE) + |W|^2 / 2 with an unpenalised intercept: C = 1/(lambda n)
    sk = LogisticRegression(C=1 / (LAMBDA * len(y)), tol=1e-12, max_iter=100000).fit(x, y)
    sk_value, _ = objective(np.concatenate([sk.coef_.ravel(), sk.intercept_]), x, y)
    print(json.dumps({"scipy": float(res.fun), "sklearn": float(sk_value), "scipy_iterations": int(res.nit)}))


if __name__ == "__main__":
    main()
