"""Bayesian optimisation over a finite set of candidates (scikit-learn's Gaussian process).

The optimiser models the score (throughput: higher is better) as a Gaussian
process over the candidates' features and proposes the candidate with the
largest *expected improvement* over the best predicted score so far.  Scores
are standardised before fitting, so ``noise`` (Horovod's
``--autotune-gaussian-process-noise``, default 0.8) is the share of the scores'
variance the model puts down to measurement noise: higher values trust each
single measurement less.

scikit-learn is an optional dependency (``pip install 'hvdlite[autotune]'``);
:func:`require_scikit_learn` says what to install where it is missing.
Deterministic for a given seed: the same samples give the same proposal.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

__all__ = ["BayesianOptimizer", "require_scikit_learn"]

_INSTALL = (
    "HVDLITE_AUTOTUNE (HOROVOD_AUTOTUNE, hvdrun --autotune) needs scikit-learn for "
    "its Bayesian optimiser, and it cannot be imported here ({error}). Install it on "
    "every host: pip install scikit-learn (or pip install 'hvdlite[autotune]'), or "
    "turn autotune off."
)


def require_scikit_learn():
    """The module ``sklearn.gaussian_process``; ImportError naming the fix if missing."""
    try:
        from sklearn import gaussian_process
    except ImportError as exc:
        raise ImportError(_INSTALL.format(error=exc)) from exc
    return gaussian_process


class BayesianOptimizer:
    """Proposes which of *candidates* (an n x d array of features in [0, 1]) to try next."""

    def __init__(
        self, candidates: np.ndarray, noise: float = 0.8, seed: int = 0, exploration: float = 0.01
    ):
        gp = require_scikit_learn()
        kernels = gp.kernels
        dims = candidates.shape[1]
        kernel = kernels.ConstantKernel(1.0, (1e-2, 1e2)) * kernels.Matern(
            length_scale=np.full(dims, 0.5), length_scale_bounds=(0.05, 5.0), nu=2.5
        )
        self._model = gp.GaussianProcessRegressor(
            kernel=kernel, alpha=noise, normalize_y=True, random_state=seed
        )
        self.candidates = candidates
        self.exploration = exploration
        self.tried: list[int] = []  # candidate indices, one per sample
        self.scores: list[float] = []

    def add(self, index: int, score: float) -> None:
        """Record that candidate *index* scored *score*."""
        self.tried.append(index)
        self.scores.append(float(score))

    def _fitted(self):
        """Fit the model to the samples; a context in which to predict.  One BLAS
        thread: this runs inside an engine cycle on rank 0, beside the framework's
        compute, and for a few dozen points more threads only add overhead."""
        from threadpoolctl import threadpool_limits

        limits = threadpool_limits(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hyperparameters at their bounds are fine here
            self._model.fit(self.candidates[self.tried], np.asarray(self.scores))
        return limits

    def propose(self) -> int:
        """The candidate of largest expected improvement (the lowest index on ties)."""
        if not self.tried:
            return 0
        with self._fitted():
            mean, std = self._model.predict(self.candidates, return_std=True)
            best = float(np.max(self._model.predict(self.candidates[self.tried])))
        spread = float(np.std(self.scores)) or abs(best) or 1.0
        improvement = mean - best - self.exploration * spread
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(std > 0, improvement / std, 0.0)
        cdf = 0.5 * np.vectorize(math.erfc)(-z / math.sqrt(2.0))
        pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        expected = np.where(std > 0, improvement * cdf + std * pdf, 0.0)
        return int(np.argmax(expected))

    def best(self) -> int:
        """The tried candidate with the highest predicted score (the model smooths
        out one lucky measurement); with one sample, that sample's candidate."""
        if len(self.tried) < 2:
            return self.tried[0] if self.tried else 0
        with self._fitted():
            predicted = self._model.predict(self.candidates[self.tried])
        return self.tried[int(np.argmax(predicted))]
