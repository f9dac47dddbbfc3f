"""The software stack a recipe was measured on; its fingerprint decides when to re-tune."""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict


class StackSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    torch: str
    torchtitan: str
    cuda: str | None = None
    nccl: str | None = None
    driver: str | None = None

    def fingerprint(self) -> str:
        """A short stable hash of every version: equal fingerprints mean nothing to re-tune."""
        text = "|".join(f"{k}={v}" for k, v in sorted(self.model_dump().items()))
        return hashlib.sha256(text.encode()).hexdigest()[:12]
