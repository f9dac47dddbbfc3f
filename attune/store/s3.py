"""The S3 back end through boto3: one PUT per object, compare-and-swap by conditional PutObject.

The endpoint, region and credentials come from boto3's usual sources (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE, ~/.aws/config).
This module never reads, stores or prints them: errors carry the bucket, key and S3 error code
only, and botocore's own exception (whose text can name the endpoint) is not chained to them.

`write_if` maps to PutObject with If-None-Match: * (create only) or If-Match: <ETag> (replace only
what was read). S3 evaluates the condition and the write as one step: of two racing conditional
PUTs one gets 412 PreconditionFailed (or 409 ConditionalRequestConflict) and the store retries it.
"""

from __future__ import annotations

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from attune.store.base import StoreError, check_key

LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
MISSING = {"NoSuchKey", "404", "NotFound"}


class S3Blobs:
    def __init__(self, bucket: str, prefix: str = "", client=None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.location = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        # Retry mode, endpoint and credentials: whatever the AWS environment / config says.
        self._client = client or _client(self.location)

    def __repr__(self) -> str:
        return f"S3Blobs({self.location!r})"

    def _key(self, key: str) -> str:
        """The object key of `key`, never outside the prefix (a key part such as '..' is refused)."""
        try:
            check_key(key.rstrip("/")) if key.strip("/") else None
        except ValueError as err:
            raise StoreError(self.location, str(err)) from None
        return f"{self.prefix}/{key}" if self.prefix else key

    def read(self, key: str) -> tuple[bytes, str] | None:
        name = self._key(key)

        def get():
            reply = self._client.get_object(Bucket=self.bucket, Key=name)
            return reply["Body"].read(), reply["ETag"]

        found, err = _send(get)
        if err is None:
            return found
        if isinstance(err, ClientError) and _code(err) in MISSING:
            return None
        raise self._error("GetObject", key, err)

    def write_if(self, key: str, data: bytes, expect: str | None) -> bool:
        condition = {"IfNoneMatch": "*"} if expect is None else {"IfMatch": expect}
        name = self._key(key)
        _, err = _send(lambda: self._client.put_object(Bucket=self.bucket, Key=name, Body=data,
                                                       ContentType="application/json", **condition))
        if err is None:
            return True
        if isinstance(err, ClientError) and (_code(err) in LOST_RACE or (expect is not None and _code(err) in MISSING)):
            return False  # someone wrote (or deleted) it since we read it: the caller reads again
        raise self._error("PutObject", key, err)

    def write(self, key: str, data: bytes, content_type: str) -> None:
        name = self._key(key)
        _, err = _send(lambda: self._client.put_object(Bucket=self.bucket, Key=name, Body=data,
                                                       ContentType=content_type))
        if err is not None:
            raise self._error("PutObject", key, err)

    def keys(self, prefix: str) -> list[str]:
        name = self._key(prefix)

        def listing():
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=name)
            return [item["Key"] for page in pages for item in page.get("Contents", [])]

        found, err = _send(listing)
        if err is not None:
            raise self._error("ListObjectsV2", prefix, err)
        strip = len(self.prefix) + 1 if self.prefix else 0
        return [key[strip:] for key in found]

    def _error(self, operation: str, key: str, err: Exception) -> StoreError:
        if isinstance(err, ClientError):
            code = _code(err)
            hint = {"NoSuchBucket": "the bucket does not exist",
                    "AccessDenied": "access denied (check the AWS credentials in the environment)",
                    "InvalidAccessKeyId": "the AWS access key is not valid",
                    "SignatureDoesNotMatch": "the AWS secret key does not match"}.get(code, f"S3 error {code}")
        elif isinstance(err, NoCredentialsError):
            hint = "no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
        else:  # connection and configuration errors: their text names the endpoint, so only the kind
            hint = f"cannot reach S3 ({type(err).__name__}; the endpoint comes from AWS_ENDPOINT_URL or the AWS config)"
        return StoreError(self.location, f"{operation} {key}: {hint}")


def _client(location: str):
    try:
        return boto3.client("s3")
    except Exception as err:  # noqa: BLE001 - e.g. a malformed AWS_ENDPOINT_URL, whose text we must not echo
        failure = type(err).__name__
    raise StoreError(location, f"cannot set up the S3 client ({failure}; check AWS_ENDPOINT_URL and the AWS config)")


def _send(call):
    """(result, None) or (None, the boto error). The caller raises its StoreError outside any
    `except` block, so the botocore exception (whose text may name the endpoint) is not even
    chained as __context__ to what the user sees."""
    try:
        return call(), None
    except (ClientError, BotoCoreError) as err:
        return None, err


def _code(err: ClientError) -> str:
    error = err.response.get("Error", {})
    return str(error.get("Code") or err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
