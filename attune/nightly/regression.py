"""Is the shipped recipe slower tonight than when it shipped, beyond the run-to-run noise?

The shipped entry records one throughput (the campaign's mean over its replicates); tonight's
re-measure gives k replicates. The band is the campaign's own search band computed from tonight's
replicates (z * sd * sqrt(2): two noisy measurements compared), floored by the registry's
regression_floor so a noise-free stack never calls a 0.1% wobble a regression. Conservative on
purpose: an unattended job that cries wolf gets ignored.
"""

from __future__ import annotations

from pydantic import BaseModel

from attune.campaign.noise import relative_sd, search_band


class Remeasure(BaseModel):
    samples: list[float]               # tokens/s/GPU of each ok replicate
    statuses: list[str]                # every replicate's status (ok, oom, crash, ...)
    reference_tps: float               # what the shipped entry measured
    reference_fingerprint: str
    mean_tps: float | None
    change: float | None               # mean / reference - 1 (negative: slower)
    band: float                        # slowdown that counts as real
    regressed: bool
    gpu_hours: float
    why: str


def judge(samples: list[float], statuses: list[str], reference_tps: float, reference_fingerprint: str,
          gpu_hours: float, floor: float = 0.02, confidence: float = 0.95) -> Remeasure:
    if not samples:
        # The shipped recipe no longer runs at all (OOM on a new stack, a crash): the worst regression.
        return Remeasure(samples=[], statuses=statuses, reference_tps=reference_tps,
                         reference_fingerprint=reference_fingerprint, mean_tps=None, change=-1.0, band=floor,
                         regressed=True, gpu_hours=gpu_hours,
                         why=f"the shipped recipe no longer runs ({', '.join(statuses)})")
    mean = sum(samples) / len(samples)
    band = max(floor, search_band(relative_sd(samples), confidence))
    change = mean / reference_tps - 1.0
    regressed = change < -band
    why = (f"{mean:,.0f} tok/s/GPU tonight vs {reference_tps:,.0f} shipped ({change:+.1%}; "
           f"noise band {band:.1%} over {len(samples)} replicates)")
    return Remeasure(samples=samples, statuses=statuses, reference_tps=reference_tps,
                     reference_fingerprint=reference_fingerprint, mean_tps=mean, change=change, band=band,
                     regressed=regressed, gpu_hours=gpu_hours, why=why)
