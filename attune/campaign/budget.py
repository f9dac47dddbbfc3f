"""GPU-hour budget: every trial is charged GPUs x wall time; no trial starts that cannot be paid for."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Budget(BaseModel):
    total_gpu_hours: float = Field(gt=0)
    spent_gpu_hours: float = Field(default=0.0, ge=0)

    @property
    def left(self) -> float:
        return max(0.0, self.total_gpu_hours - self.spent_gpu_hours)

    def can_afford(self, estimated_gpu_hours: float) -> bool:
        return estimated_gpu_hours <= self.left + 1e-12

    def charge(self, gpu_hours: float) -> None:
        self.spent_gpu_hours += max(0.0, gpu_hours)


def gpu_hours(gpus: int, wall_time_s: float) -> float:
    return gpus * wall_time_s / 3600.0


def hours_text(hours: float) -> str:
    """GPU-hours as a person reads them: one decimal on a GPU cluster, three digits on a CPU campaign
    whose whole budget is a fraction of an hour."""
    return f"{hours:.1f}" if abs(hours) >= 10 else f"{hours:.3g}"
