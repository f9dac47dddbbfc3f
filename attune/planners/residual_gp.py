"""A Gaussian process on a model's log-residual over layout features (BoTorch's SingleTaskGP on
GPyTorch), and the expected improvement of the beliefs it gives (attune.planners.belief uses it for
throughput and for peak memory).

  prior mean   zero: the model (the fitted estimator) is the mean, the GP models only what it misses
  prior width  given (attune.planners.belief calibrates it)
  correlation  layouts a few levers apart miss alike: an RBF kernel over log2 degrees, log2 batch,
               recomputation, compile, float8 and schedule, one lengthscale for all (a campaign has
               too few trials to learn one per feature)
  noise        the run-to-run noise the baseline replicates measured
  priors       a shift with its own width on the layouts that make a given move (a lesson of the
               catalog, attune.planners.attune_planner): one linear kernel on an indicator each
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from attune.sim.arrays import AC_MODES, FLOAT8_MODES, SCHEDULES, LayoutArrays

CHUNK = 65536   # candidates predicted together (their cross-covariance with the trials is CHUNK x trials)

_INTERLEAVED = np.array(["Interleaved" in s or s.startswith("ZBV") for s in SCHEDULES])
_ZERO_BUBBLE = np.array(["ZeroBubble" in s for s in SCHEDULES])


def features(a: LayoutArrays) -> np.ndarray:
    """One row per layout: the coordinates the kernel measures distance in (a one-step change of
    one lever is about 1 apart)."""
    pipelined = np.asarray(a.pp) > 1
    cols = [np.log2(np.asarray(x, dtype=float)) for x in (a.tp, a.pp, a.cp, a.ep, a.dpr, a.dps, a.lb)]
    cols += [np.where(pipelined, np.log2(np.asarray(a.mb, dtype=float)), 0.0),
             np.asarray(a.ac, dtype=float) / max(1, len(AC_MODES) - 1),
             np.asarray(a.comp, dtype=float),
             (np.asarray(a.f8) > 0).astype(float) if len(FLOAT8_MODES) > 1 else np.zeros(len(a)),
             np.where(pipelined, _INTERLEAVED[np.asarray(a.sched)], 0.0),
             np.where(pipelined, _ZERO_BUBBLE[np.asarray(a.sched)], 0.0)]
    return np.stack(cols, axis=1)


@dataclass(frozen=True)
class Prior:
    """A shift of the log-residual, with its own width, on the layouts where `where` is true."""
    shift: float
    width: float
    where: np.ndarray           # bool per candidate layout
    where_measured: np.ndarray  # bool per measured row


class ResidualGP:
    """The GP of one proposal: conditioned on the measured rows, asked about the candidates."""

    @dataclass(frozen=True)
    class Config:
        lengthscale: float = 1.5      # correlation 0.8 one lever step away, 0.4 two steps away
        min_noise_sd: float = 0.005   # the noise floor of attune.campaign.noise

    def __init__(self, config: "ResidualGP.Config | None" = None):
        self.config = config or ResidualGP.Config()

    def posterior(self, x_measured: np.ndarray, residuals: np.ndarray, noise_sd: "float | np.ndarray", width: float,
                  x_candidates: np.ndarray, priors: list[Prior] = (), correlated: bool = True
                  ) -> tuple[np.ndarray, np.ndarray]:
        """The candidates' residuals given the measured ones: posterior mean (priors' shifts included)
        and sd. `noise_sd`: one for every measured row, or one per row (an earlier campaign's rows carry
        more). With `correlated` off, each layout's residual is independent of every other's."""
        import torch
        from botorch.models import SingleTaskGP
        from gpytorch.kernels import LinearKernel, RBFKernel, ScaleKernel
        from gpytorch.means import ZeroMean
        from linear_operator.operators import DiagLinearOperator
        from linear_operator.utils.warnings import NumericalWarning

        d = x_measured.shape[1]
        shift_m = sum((p.shift * p.where_measured for p in priors), np.zeros(len(residuals)))
        shift_c = sum((p.shift * p.where for p in priors), np.zeros(len(x_candidates)))
        ind_m = np.stack([p.where_measured for p in priors], axis=1).astype(float) if priors else np.zeros((len(residuals), 0))
        ind_c = np.stack([p.where for p in priors], axis=1).astype(float) if priors else np.zeros((len(x_candidates), 0))
        train_x = torch.as_tensor(np.hstack([x_measured, ind_m]), dtype=torch.float64)
        train_y = torch.as_tensor(residuals - shift_m, dtype=torch.float64).unsqueeze(-1)
        noise = np.broadcast_to(np.maximum(noise_sd, self.config.min_noise_sd) ** 2, residuals.shape).copy()
        base = RBFKernel(active_dims=list(range(d)))
        base.lengthscale = self.config.lengthscale if correlated else 1e-6
        kernel = ScaleKernel(base)
        kernel.outputscale = width ** 2
        for i, p in enumerate(priors):
            linear = LinearKernel(active_dims=[d + i])
            linear.variance = p.width ** 2
            kernel = kernel + linear
        model = SingleTaskGP(train_x, train_y, train_Yvar=torch.as_tensor(noise, dtype=torch.float64).unsqueeze(-1), covar_module=kernel,
                             mean_module=ZeroMean(), outcome_transform=None)
        model.eval()
        x = torch.as_tensor(np.hstack([x_candidates, ind_c]), dtype=torch.float64)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", NumericalWarning)   # jitter on a near-duplicate trial: expected
            model(train_x[:1])   # conditions the model: gpytorch caches the training solve in its prediction strategy
            strategy, means, variances = model.prediction_strategy, [], []
            for chunk in torch.split(x, CHUNK):
                # the candidates' own covariance as its diagonal: gpytorch's posterior would build it whole
                cross = kernel(chunk, train_x).to_dense()
                means.append(strategy.exact_predictive_mean(torch.zeros(len(chunk), dtype=x.dtype), cross))
                own = DiagLinearOperator(kernel(chunk, diag=True))
                variances.append(strategy.exact_predictive_covar(own, cross).diagonal())
        mean = torch.cat(means).numpy() if means else np.zeros(0)
        sd = torch.cat(variances).clamp_min(1e-18).sqrt().numpy() if variances else np.zeros(0)
        return mean + shift_c, sd


def log_expected_improvement(mean: np.ndarray, sd: np.ndarray, threshold: np.ndarray | float
                             ) -> tuple[np.ndarray, np.ndarray]:
    """log EI and log P(improvement) of a normal belief (mean, sd) over `threshold`, per layout.

    BoTorch's LogEI on a batch of q=1 points runs one GP prediction per candidate (seconds for
    thousands) and a joint posterior builds the candidates' whole covariance; the mean and sd come
    from ResidualGP.posterior instead, and BoTorch's numerically careful log EI is applied to them
    (_log_ei_helper, a private name: botorch is pinned)."""
    import torch
    from botorch.acquisition.analytic import _log_ei_helper
    from botorch.utils.probability.utils import log_ndtr

    sd = np.maximum(np.asarray(sd, dtype=float), 1e-9)
    u = torch.as_tensor((np.asarray(mean, dtype=float) - threshold) / sd)
    return (_log_ei_helper(u) + torch.as_tensor(sd).log()).numpy(), log_ndtr(u).numpy()
