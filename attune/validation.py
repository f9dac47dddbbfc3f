"""Turn pydantic's validation errors into the one-line (field, rule) form users see, and the rules
shared by every model whose values reach a path, a store key or a page."""

from __future__ import annotations

import re

from pydantic import ValidationError

# A name becomes a folder name ($ATTUNE_HOME/campaigns/<name>-<id>), an S3 key part and an MLflow
# tag: only characters that need no quoting anywhere, never a path separator, never a hidden file.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A file name is at most 255 bytes; 128 leaves room for the campaign id and the suffixes ATTUNE
# appends to the names it derives (-attune, -tuned, -trial), so a shipped recipe loads again.
NAME_MAX = 128
GIVEN_MAX = 60   # a value echoed in an error is cut here: the error stays one readable line


def name_rule(value: str, what: str = "name") -> str:
    """`value` if it is a safe name, else ValueError saying the rule (for pydantic validators)."""
    if not NAME.fullmatch(value) or ".." in value:
        raise ValueError(f"{what} {given(value)} must be letters, digits, '.', '_' or '-', start with a "
                         f"letter or digit and hold no '..' (it names folders and store keys)")
    if len(value) > NAME_MAX:
        raise ValueError(f"{what} must be at most {NAME_MAX} characters, got {len(value)}")
    return value


def given(value: object) -> str:
    """The value as an error message echoes it: repr, cut to GIVEN_MAX characters."""
    text = repr(value)
    return text if len(text) <= GIVEN_MAX else text[:GIVEN_MAX - 4] + "...'"


def first_error(err: ValidationError, prefix: str = "") -> tuple[str, str]:
    """The first error as (dotted field path, rule in words), with the value given where the rule
    does not already show it."""
    item = err.errors()[0]
    loc = ".".join(str(part) for part in item.get("loc", ()))
    field = ".".join(p for p in (prefix, loc) if p)
    rule = item.get("msg", "invalid")
    if item.get("type") == "extra_forbidden":
        rule = "unknown key"
    elif item.get("type") == "missing":
        rule = "required key is missing"
    rule = rule.removeprefix("Value error, ")
    value = item.get("input")
    if item.get("type") not in ("extra_forbidden", "missing") and isinstance(value, (str, int, float)) \
            and given(value) not in rule and ", got " not in rule:
        rule = f"{rule}, got {given(value)}"
    return field, rule
