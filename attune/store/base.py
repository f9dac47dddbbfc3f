"""The recipe store over any back end that offers atomic whole-object writes and compare-and-swap.

A back end (attune.store.local.LocalBlobs, attune.store.s3.S3Blobs) stores opaque objects by key and
offers one conditional primitive, `write_if(key, data, expect)`: write only if the object's version
is still `expect` (None: only if there is no object). Everything else lives here, once:

- put(entry): read the current entry, stop if it is at least as good (attune.store.entry.rank), else
  write_if against the version just read; on a lost race, read again and retry. So the stored entry
  only ever moves to a better one, whatever the interleaving of writers.
- The index (index.json, one summary row per entry) is updated after the entry, by the same
  read / compare-and-swap loop. Its row is taken from the entry as re-read inside that loop, so a
  slow writer can never put an older row over a newer one.
"""

from __future__ import annotations

import json
import random
import time
from typing import Iterator, Protocol

from pydantic import ValidationError

from attune.errors import InputError
from attune.store.entry import SEGMENT, StoreEntry, better, entry_key

INDEX_KEY = "index.json"
ENTRY_PREFIX = "recipes/"
INDEX_SCHEMA = 1


class StoreError(InputError):
    """The store cannot be read or written. Messages name the store location and the object key,
    never the endpoint or credentials (boto3 reads those from the environment)."""

    def __init__(self, location: str, rule: str):
        super().__init__(f"store {location}", rule)


class Blobs(Protocol):
    location: str  # printable: a folder or s3://bucket/prefix, never an endpoint or a secret

    def read(self, key: str) -> tuple[bytes, str] | None:
        """(data, version) of the object, or None if there is none."""
        ...

    def write_if(self, key: str, data: bytes, expect: str | None) -> bool:
        """Replace the object atomically if its version is still `expect` (None: if absent)."""
        ...

    def write(self, key: str, data: bytes, content_type: str) -> None:
        """Replace the object atomically, unconditionally (published pages: last writer wins)."""
        ...

    def keys(self, prefix: str) -> list[str]:
        ...


class RecipeStore:
    def __init__(self, blobs: Blobs, attempts: int = 40):
        self.blobs = blobs
        self.attempts = attempts

    def __repr__(self) -> str:
        return f"RecipeStore({self.location!r})"

    @property
    def location(self) -> str:
        return self.blobs.location

    def get(self, model: str, cluster_label: str, stack_fingerprint: str) -> StoreEntry | None:
        try:
            key = entry_key(model, cluster_label, stack_fingerprint)
        except ValueError as err:
            raise InputError("store key", str(err)) from None
        found = self.blobs.read(key)
        return self._decode(key, found[0]) if found else None

    def put(self, entry: StoreEntry) -> tuple[bool, StoreEntry]:
        """Store `entry` unless the stored one for its key ranks at least as high.

        Returns (kept, current): kept is True when `entry` was written; current is what the key
        holds after this call (the entry itself when kept).
        """
        key = entry.key
        data = encode(entry)
        for attempt in range(self.attempts):
            found = self.blobs.read(key)
            current = self._decode(key, found[0]) if found else None
            if not better(entry, current):
                self._sync_index(key)  # repairs an index left behind by a writer that died
                return False, current
            if self.blobs.write_if(key, data, found[1] if found else None):
                self._sync_index(key)
                return True, entry
            _backoff(attempt)
        raise StoreError(self.location, f"{key}: gave up after {self.attempts} conflicting writes")

    def list(self) -> list[StoreEntry]:
        return [self._decode(key, data) for key, data in stored(self.blobs, ENTRY_PREFIX)
                if key.endswith("/entry.json")]

    def index(self) -> dict:
        """{"schema": 1, "entries": {key: summary row}}; an empty index when none was written yet."""
        found = self.blobs.read(INDEX_KEY)
        return _parse_index(self.location, found[0]) if found else {"schema": INDEX_SCHEMA, "entries": {}}

    def put_blob(self, key: str, data: bytes, content_type: str | None = None) -> str:
        """Write a file (a published page) at `key` inside the store; returns where it went."""
        try:
            check_key(key)
        except ValueError as err:
            raise InputError("store key", str(err)) from None
        self.blobs.write(key, data, content_type or _content_type(key))
        return f"{self.location.rstrip('/')}/{key}"

    def _sync_index(self, key: str) -> None:
        for attempt in range(self.attempts):
            found = self.blobs.read(INDEX_KEY)
            index = _parse_index(self.location, found[0]) if found else {"schema": INDEX_SCHEMA, "entries": {}}
            entry_found = self.blobs.read(key)  # read after the index: see the module docstring
            if entry_found is None:
                return
            row = summary(self._decode(key, entry_found[0]))
            if index["entries"].get(key) == row:
                return
            index["entries"][key] = row
            blob = json.dumps(index, indent=1, sort_keys=True).encode()
            if self.blobs.write_if(INDEX_KEY, blob, found[1] if found else None):
                return
            _backoff(attempt)
        raise StoreError(self.location, f"{INDEX_KEY}: gave up after {self.attempts} conflicting writes")

    def _decode(self, key: str, data: bytes) -> StoreEntry:
        try:
            return StoreEntry.model_validate_json(data)
        except ValidationError as err:
            item = err.errors()[0]
            where = ".".join(map(str, item.get("loc", ()))) or "entry"
            raise StoreError(self.location, f"{key}: not a valid entry ({where}: {item['msg']})") from None


def stored(blobs: Blobs, prefix: str) -> Iterator[tuple[str, bytes]]:
    """Every object under `prefix`, in key order, as (key, data); one removed between the listing and
    its read is passed over."""
    for key in sorted(blobs.keys(prefix)):
        found = blobs.read(key)
        if found is not None:
            yield key, found[0]


def check_key(key: str) -> str:
    """`key` if every /-separated part is a safe name (entry.SEGMENT), else ValueError. The back ends
    call it on every key they touch: whatever a caller builds a key from, it stays inside the store's
    folder or prefix (no '..', no absolute path, no empty part, nothing that needs quoting)."""
    if not all(SEGMENT.match(part) for part in key.split("/")):
        raise ValueError(f"{key!r}: use /-separated names of letters, digits, . _ - (each starting with a "
                         f"letter or digit)")
    return key


def encode(entry: StoreEntry) -> bytes:
    return json.dumps(entry.model_dump(mode="json"), indent=2, sort_keys=True).encode()


def summary(entry: StoreEntry) -> dict:
    """The index row: everything but the bulky recipe TOML and gate report."""
    return entry.model_dump(mode="json", exclude={"recipe_toml", "gate_report"})


def _parse_index(location: str, data: bytes) -> dict:
    try:
        index = json.loads(data)
        if not isinstance(index.get("entries"), dict):
            raise ValueError("no entries table")
    except (ValueError, AttributeError) as err:
        raise StoreError(location, f"{INDEX_KEY}: not a valid index ({err})") from None
    return index


def _backoff(attempt: int) -> None:
    # Full jitter: writers that collided once should not collide again in lock-step.
    time.sleep(random.uniform(0, min(0.2, 0.002 * 2 ** attempt)))


def _content_type(key: str) -> str:
    for suffix, kind in ((".html", "text/html; charset=utf-8"), (".json", "application/json"),
                         (".md", "text/markdown; charset=utf-8"), (".toml", "application/toml")):
        if key.endswith(suffix):
            return kind
    return "application/octet-stream"
