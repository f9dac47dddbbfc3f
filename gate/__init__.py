"""The correctness gate: a faster recipe ships only if it still trains the same objective.

    check_config(baseline, candidate)      -> ConfigVerdict       field classes + known-defects catalog
    check_convergence(curves_dir, out_dir) -> ConvergenceVerdict  curves against replicate-calibrated bands
    verify(baseline, candidate, workdir)   -> GateReport          both, with real curves from the proxy
"""

from gate.config_check import check_config
from gate.convergence import check_convergence
from gate.models import Check, ConfigVerdict, ConvergenceVerdict, DefectHit, GateReport, NumericsChange, Violation
from gate.verify import verify

__all__ = ["check_config", "check_convergence", "verify", "Check", "ConfigVerdict", "ConvergenceVerdict",
           "DefectHit", "GateReport", "NumericsChange", "Violation"]
