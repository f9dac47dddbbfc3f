"""The folder back end: objects are files under a root folder.

Writes go to a temporary file in the same folder, are fsynced, then renamed over the target, so a
reader sees the old file or the new one, never part of one. The compare-and-swap `write_if` holds an
exclusive fcntl.flock on the object's folder while it compares and renames: writers in other
processes or threads (each opens its own descriptor) queue there. Readers take no lock.
The version of a file is the SHA-256 of its bytes, so an unchanged file keeps its version and a
recycled inode number cannot fool the comparison. flock is reliable on local file systems; on NFS
it depends on the server, so point several hosts at S3 instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import uuid
from contextlib import contextmanager
from pathlib import Path

from attune.store.base import StoreError, check_key


class LocalBlobs:
    def __init__(self, root: Path | str):
        self.root = Path(root).absolute()
        self.location = str(self.root)

    def __repr__(self) -> str:
        return f"LocalBlobs({self.location!r})"

    def _path(self, key: str) -> Path:
        """The file of `key`, never outside the root (a key part such as '..' is refused)."""
        try:
            return self.root / check_key(key)
        except ValueError as err:
            raise StoreError(self.location, str(err)) from None

    def read(self, key: str) -> tuple[bytes, str] | None:
        path = self._path(key)
        with self._errors(key):
            try:
                data = path.read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
        return data, _version(data)

    def write_if(self, key: str, data: bytes, expect: str | None) -> bool:
        path = self._path(key)
        with self._errors(key), _folder(path) as folder:
            fcntl.flock(folder, fcntl.LOCK_EX)  # released when the folder descriptor closes
            current = self.read(key)
            if (current[1] if current else None) != expect:
                return False
            _replace(path, data, folder)
            return True

    def write(self, key: str, data: bytes, content_type: str = "") -> None:
        path = self._path(key)
        with self._errors(key), _folder(path) as folder:
            _replace(path, data, folder)

    @contextmanager
    def _errors(self, key: str):
        try:
            yield
        except OSError as err:
            raise StoreError(self.location, f"{key}: {err.strerror or err}") from None

    def keys(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.is_dir():
            return []
        return [p.relative_to(self.root).as_posix() for p in base.rglob("*")
                if p.is_file() and not p.name.startswith(".")]  # .name.*.tmp: a write in progress


@contextmanager
def _folder(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        yield folder
    finally:
        os.close(folder)


def _replace(path: Path, data: bytes, folder_fd: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.fsync(folder_fd)  # make the rename itself durable


def _version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
