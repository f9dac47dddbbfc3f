"""Turn pydantic's validation errors into the one-line (field, rule) form users see."""

from __future__ import annotations

from pydantic import ValidationError


def first_error(err: ValidationError, prefix: str = "") -> tuple[str, str]:
    """The first error as (dotted field path, rule in words)."""
    item = err.errors()[0]
    loc = ".".join(str(part) for part in item.get("loc", ()))
    field = ".".join(p for p in (prefix, loc) if p)
    rule = item.get("msg", "invalid")
    if item.get("type") == "extra_forbidden":
        rule = "unknown key"
    elif item.get("type") == "missing":
        rule = "required key is missing"
    rule = rule.removeprefix("Value error, ")
    return field, rule
