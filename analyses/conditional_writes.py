"""Compare-and-swap on one object of an S3-compatible store: conditional ``PUT`` and ``DELETE``.

S3 (since 2024), MinIO and moto's server honour ``If-None-Match: *`` on ``PutObject`` (write only
if the key is absent) and ``If-Match: <ETag>`` on ``PutObject`` and ``DeleteObject`` (replace or
delete only the version that was read). Each is atomic at the store: of two writers that both
saw the same state, one succeeds and the other gets ``412 Precondition Failed`` (or ``409
ConditionalRequestConflict`` while the first is still in flight). pyarrow's S3 filesystem cannot
send these headers, so this goes through boto3, configured from the same standard variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``).

Some S3-compatible servers ignore the headers and answer ``200``: :meth:`ConditionalStore.honoured`
finds that out once per store with a probe object, so the caller can fall back to what it can do
without them.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

_LOST = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409", "NoSuchKey", "404")
# once per (endpoint, bucket) and process: the probe costs three requests
_HONOURED: dict[tuple[str, str], bool] = {}


class StoreRequestError(Exception):
    """A request the store refused or could not answer (not a lost condition)."""


def s3_client() -> Any:
    """A boto3 S3 client from the standard variables; path-style addressing with a custom
    endpoint (as pyarrow uses), short timeouts and one retry, so a wrong endpoint fails in seconds."""
    import boto3  # on first use: only a writer to an object store needs it
    from botocore.config import Config

    endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
    cfg = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"},
                 s3={"addressing_style": "path"} if endpoint else {})
    return boto3.client("s3", endpoint_url=endpoint, region_name=region, config=cfg)


def _code(exc: Exception) -> str:
    resp = getattr(exc, "response", None) or {}
    err = resp.get("Error", {}) if isinstance(resp, dict) else {}
    return str(err.get("Code") or resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")


class ConditionalStore:
    """Conditional writes on the objects of ``bucket``; keys are the bucket's own (no bucket name)."""

    def __init__(self, bucket: str, client: Any | None = None) -> None:
        self.bucket = bucket
        self.client = client if client is not None else s3_client()

    def _request(self, op: str, **kw: Any) -> Any | None:
        """``client.<op>(**kw)``; None when a condition did not hold (or the key is gone)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, op)(Bucket=self.bucket, **kw)
        except ClientError as exc:
            if _code(exc) in _LOST:
                return None
            raise StoreRequestError(f"{op} {kw.get('Key')}: {_code(exc)}: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreRequestError(f"{op} {kw.get('Key')}: {exc}") from exc

    def read(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, or None when there is none."""
        got = self._request("get_object", Key=key)
        return None if got is None else (got["Body"].read(), got["ETag"])

    def create(self, key: str, body: bytes) -> str | None:
        """Write ``key`` if it does not exist: its ETag, or None when it already did."""
        put = self._request("put_object", Key=key, Body=body, IfNoneMatch="*")
        return None if put is None else put["ETag"]

    def replace(self, key: str, body: bytes, etag: str) -> str | None:
        """Overwrite ``key`` if it is still the version ``etag``: the new ETag, or None."""
        put = self._request("put_object", Key=key, Body=body, IfMatch=etag)
        return None if put is None else put["ETag"]

    def delete(self, key: str, etag: str) -> bool:
        """Delete ``key`` if it is still the version ``etag``."""
        return self._request("delete_object", Key=key, IfMatch=etag) is not None

    def delete_any(self, key: str) -> None:
        self._request("delete_object", Key=key)

    def honoured(self, probe_dir: str) -> bool:
        """Whether the store refuses a second ``If-None-Match: *`` write of one key (once per store
        and process; the probe object, under ``probe_dir``, is removed)."""
        where = (str(self.client.meta.endpoint_url), self.bucket)
        if where not in _HONOURED:
            key = f"{probe_dir.rstrip('/')}/.conditional-probe-{uuid.uuid4().hex}"
            try:
                first = self.create(key, b"1")
                _HONOURED[where] = first is not None and self.create(key, b"2") is None
            finally:
                self.delete_any(key)
        return _HONOURED[where]
