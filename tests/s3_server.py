"""moto's S3 server (server mode, real HTTP) for tests: started here, stopped by its pid.

    with s3_server(tmp_path) as url:      # http://127.0.0.1:PORT
        env = s3_env(url, tmp_path)        # AWS_* variables that point boto3 at it
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from prefect_server import free_port, spawn, stop, tail

KEY_ID, SECRET = "AKIAKEYIDNEVERSHOWN", "secret-never-shown-0123456789"


@contextlib.contextmanager
def s3_server(workdir: Path, timeout_s: float = 60.0) -> Iterator[str]:
    port = free_port()
    log = Path(workdir) / "moto.log"
    proc = spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], dict(os.environ), log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start:\n{tail(log)}") from None
                time.sleep(0.1)
        yield url
    finally:
        stop(proc)


def s3_env(url: str, workdir: Path) -> dict[str, str]:
    """AWS variables for boto3 (and Prefect's S3 block) against the server, throw-away credentials,
    no profile or config file of the machine's."""
    return {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": str(Path(workdir) / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(Path(workdir) / "no-aws-credentials")}
