"""After how many hours of production training the GPU-hours a campaign spent are repaid."""

from __future__ import annotations


def payback_hours(gpu_hours_spent: float, gain: float, gpus: int) -> float | None:
    """Hours of training on `gpus` GPUs until the faster recipe has saved what tuning cost.

    A job of T hours at the old speed takes T/(1+gain) at the new one, saving gpus·T·gain/(1+gain)
    GPU-hours; setting that equal to the spend gives T. None when there is no gain to repay it.
    """
    if gain <= 0:
        return None
    return gpu_hours_spent * (1.0 + gain) / (gpus * gain)
