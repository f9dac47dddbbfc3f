"""The recipe store: the best verified recipe per (model, cluster, stack), in a folder or on S3.

    store = open_store(None)                 # $ATTUNE_STORE, else $ATTUNE_HOME/store (./.attune/store)
    store = open_store("s3://bucket/prefix") # endpoint and credentials from the AWS environment
    kept, current = store.put(entry)         # keeps the better of entry and what is stored
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from attune.errors import InputError
from attune.files import attune_home
from attune.store.base import RecipeStore, StoreError, check_key
from attune.store.entry import (StoreEntry, better, cost_per_million_tokens, entry_for_recipe, entry_key,
                                rank)
from attune.store.local import LocalBlobs

__all__ = ["RecipeStore", "StoreEntry", "StoreError", "better", "cost_per_million_tokens", "default_store_uri",
           "entry_for_recipe", "entry_key", "open_store", "rank", "store_location"]

# AWS's bucket naming rules, simplified: what S3 and S3-compatible stores all accept.
S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def default_store_uri() -> str:
    """$ATTUNE_STORE if set, else the store folder under $ATTUNE_HOME (./.attune when unset)."""
    return os.environ.get("ATTUNE_STORE") or str(attune_home() / "store")


def open_store(uri: str | None = None) -> RecipeStore:
    """A store from `s3://bucket[/prefix]`, `file:///path`, a folder path, or None for the default."""
    where = store_location(uri)
    if where[0] == "s3":
        from attune.store.s3 import S3Blobs  # boto3 loads only when S3 is used

        return RecipeStore(S3Blobs(where[1], where[2]))
    return RecipeStore(LocalBlobs(where[1]))


def parse_s3_url(uri: str, field: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://BUCKET[/PREFIX]`, or an InputError naming `field`."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket:
        raise InputError(field, f"{uri!r}: expected s3://BUCKET[/PREFIX]")
    if not S3_BUCKET.fullmatch(bucket):
        raise InputError(field, f"{uri!r}: an S3 bucket name is 3-63 lower-case letters, digits, '.' or '-'")
    prefix = prefix.strip("/")
    try:
        check_key(prefix) if prefix else None
    except ValueError as err:
        raise InputError(field, f"{uri!r}: prefix {err}") from None
    return bucket, prefix


def store_location(uri: str | None = None) -> tuple[str, str, str]:
    """("s3", bucket, prefix) or ("folder", path, ""), or an InputError naming --store: a pure check,
    so a command can refuse a bad --store before it runs anything (nothing is created or contacted)."""
    uri = uri or default_store_uri()
    if uri.startswith("s3://"):
        return ("s3", *parse_s3_url(uri, "--store"))
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    elif "://" in uri:
        raise InputError("--store", f"{uri.split('://')[0]}:// is not supported; use s3://BUCKET/PREFIX or a folder")
    if Path(uri).exists() and not Path(uri).is_dir():
        raise InputError("--store", f"{uri}: is a file; the store is a folder")
    return "folder", uri, ""
