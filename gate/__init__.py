"""The correctness gate: a faster recipe ships only if it still trains the same objective.

    check_config(baseline, candidate)      -> ConfigVerdict       field classes + known-defects catalog
    check_convergence(curves_dir, out_dir) -> ConvergenceVerdict  curves against replicate-calibrated bands
    verify(baseline, candidate, workdir)   -> GateReport          both, with real curves from the proxy

`verify` (and with it torch, for the proxy) is imported on first use: the config check alone stays light.
"""

from attune.gate.config_check import check_config
from attune.gate.convergence import check_convergence
from attune.gate.models import Check, ConfigVerdict, ConvergenceVerdict, DefectHit, GateReport, NumericsChange, Violation

__all__ = ["check_config", "check_convergence", "verify", "Check", "ConfigVerdict", "ConvergenceVerdict",
           "DefectHit", "GateReport", "NumericsChange", "Violation"]


def __getattr__(name: str):
    if name == "verify":
        from attune.gate.pipeline import verify
        return verify
    raise AttributeError(f"module 'gate' has no attribute {name!r}")
