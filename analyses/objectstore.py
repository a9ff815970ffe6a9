"""A warehouse on S3 (or an S3-compatible store): the same layout and the same publish contract.

Object stores have no rename, so the manifest-written-last design of :mod:`analyses.warehouse`
carries over with one change: a run is built and checked in a private local warehouse exactly
as on disk, then its version files are uploaded under their immutable names, and the manifest
object ``manifests/<run_id>.json`` is ``PUT`` **last** (one ``PUT`` of one object is atomic).
Readers follow manifests only, so an upload that dies half-way leaves files no manifest names:
invisible, and removed by the run's next publish.

Readers keep a local mirror (``$POLYTRACE_CACHE``, default ``~/.cache/polytrace/warehouses``):
the published manifests and the files they name, downloaded once (version files never change,
so a cached one is never stale). Every read path (DuckDB views, ``scan_table``, fits, reports)
then runs unchanged on the mirror.

Writers of one run id are kept apart by a lease object ``.locks/<run_id>.lease`` (owner, expiry)
rather than an OS lock, taken and given back by conditional writes (:mod:`analyses.conditional_writes`):
it is created only if absent, an expired one is replaced only if it is still the version read,
and it is deleted only if it is still the holder's own. So of two writers that find it free (or
expired) at once exactly one goes ahead, and a writer whose lease expired and was taken over
cannot delete its successor's. A writer that dies holds the lease until it expires
(:data:`LEASE_TTL_S`); a writer slower than that can lose it. On a store that ignores the
conditions (found by a probe, once per store), the lease falls back to write, wait
:data:`LEASE_SETTLE_S`, read back: two writers within that interval can then both go ahead; each
still publishes a whole version (the later manifest ``PUT`` wins) and the loser's files are
removed at the next publish.

Credentials and endpoint come from the standard variables: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``/``AWS_DEFAULT_REGION`` and
``AWS_ALLOW_HTTP`` (plain ``http://`` endpoints, e.g. a local MinIO).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs

from analyses.conditional_writes import ConditionalStore, StoreRequestError
from analyses.schema import TABLES
from analyses.warehouse import MANIFESTS, PublishedRun, RunLocked, kill_point, read_published

SCHEME = "s3://"
ENV_CACHE = "POLYTRACE_CACHE"
LEASE_TTL_S = 3600.0
LEASE_SETTLE_S = 0.5
LOCKS = ".locks"


class StoreError(Exception):
    """The object store cannot be used: unreachable endpoint, refused credentials, missing bucket."""


def is_object_url(location: str | os.PathLike[str] | None) -> bool:
    return location is not None and str(location).startswith(SCHEME)


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def s3_filesystem() -> pafs.S3FileSystem:
    """pyarrow's S3 client configured from the standard AWS variables; it fails fast (one attempt,
    short timeouts) so a wrong endpoint is an error in seconds, not a hang."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
    scheme = "https"
    if endpoint is not None and "://" in endpoint:
        scheme, endpoint = endpoint.split("://", 1)
        if scheme == "http" and not _truthy(os.environ.get("AWS_ALLOW_HTTP")):
            raise StoreError(f"AWS_ENDPOINT_URL is plain http ({endpoint}); set AWS_ALLOW_HTTP=true to allow it")
    kw: dict = {"scheme": scheme, "connect_timeout": 5, "request_timeout": 30,
                "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=2)}
    if endpoint:
        kw["endpoint_override"] = endpoint.rstrip("/")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kw["region"] = region
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        kw.update(access_key=key, secret_key=secret, session_token=os.environ.get("AWS_SESSION_TOKEN"))
    return pafs.S3FileSystem(**kw)


def _lease_doc(got: tuple[bytes, str] | None) -> dict | None:
    """A lease object's document (as read: bytes and ETag), or None when absent or unreadable."""
    try:
        doc = json.loads(got[0]) if got is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _free(holder: dict | None, now: float) -> bool:
    """No live lease: none, an unreadable one, or one past its expiry."""
    return holder is None or float(holder.get("expires", 0)) < now


def describe(url: str, exc: Exception) -> StoreError:
    """One line saying which of the store's failures this is."""
    msg = str(exc)
    if "NETWORK_CONNECTION" in msg or "curlCode" in msg or "Could not connect to the endpoint" in msg:
        why = f"cannot reach the endpoint {os.environ.get('AWS_ENDPOINT_URL') or '(AWS default)'}"
    elif "NO_SUCH_BUCKET" in msg or "NoSuchBucket" in msg or "bucket does not exist" in msg:
        why = "the bucket does not exist"
    elif any(k in msg for k in ("ACCESS_DENIED", "INVALID_ACCESS_KEY", "SIGNATURE_DOES_NOT_MATCH", "403",
                                "InvalidAccessKeyId", "AccessDenied", "credentials")):
        why = "the credentials were refused (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
    else:
        why = msg.splitlines()[0][:200] if msg else type(exc).__name__
    return StoreError(f"warehouse {url}: {why}")


class ObjectWarehouse:
    """The warehouse at ``s3://bucket/prefix``: publish a locally built run, mirror what is published."""

    def __init__(self, url: str, cache: Path | None = None) -> None:
        rest = url[len(SCHEME):].strip("/")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise StoreError(f"warehouse {url}: no bucket (expected s3://bucket/prefix)")
        self.url = f"{SCHEME}{bucket}/{prefix}".rstrip("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.fs = s3_filesystem()
        base = cache or Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "polytrace" / "warehouses")
        where = f"{os.environ.get('AWS_ENDPOINT_URL', '')}|{self.url}"
        self.mirror = base / f"{bucket}-{hashlib.sha256(where.encode()).hexdigest()[:12]}"
        self._cas: ConditionalStore | None = None

    def key(self, rel: str) -> str:
        """``rel``'s path for pyarrow: the bucket, then :meth:`object_key`."""
        return "/".join(p for p in (self.bucket, self.object_key(rel)) if p)

    # ------------------------------------------------------------ small object I/O

    def _call(self, fn, *args, **kw):  # noqa: ANN001, ANN202 - a thin error-translating wrapper
        try:
            return fn(*args, **kw)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise describe(self.url, exc) from exc

    def _get(self, rel: str) -> bytes | None:
        try:
            with self._call(self.fs.open_input_stream, self.key(rel)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _put(self, rel: str, data: bytes) -> None:
        def write() -> None:
            with self.fs.open_output_stream(self.key(rel)) as f:
                f.write(data)
        self._call(write)

    def _list(self, rel: str) -> list[pafs.FileInfo]:
        sel = pafs.FileSelector(self.key(rel), allow_not_found=True, recursive=False)
        return [i for i in self._call(self.fs.get_file_info, sel) if i.type == pafs.FileType.File]

    # ------------------------------------------------------------ reading

    def check(self) -> None:
        """Raise :class:`StoreError` unless the endpoint answers, the credentials work and the bucket exists."""
        if self._call(self.fs.get_file_info, self.bucket).type == pafs.FileType.NotFound:
            raise StoreError(f"warehouse {self.url}: the bucket does not exist")
        self._list(MANIFESTS)

    def manifests(self) -> dict[str, PublishedRun]:
        """Every published run by id (an unreadable manifest is left out, as on disk)."""
        out = {}
        for info in self._list(MANIFESTS):
            if not info.base_name.endswith(".json"):
                continue
            data = self._get(f"{MANIFESTS}/{info.base_name}")
            try:
                m = PublishedRun.from_json(data.decode()) if data else None
            except (ValueError, KeyError):
                m = None
            if m is not None:
                out[m.run_id] = m
        return out

    def sync(self) -> Path:
        """Bring the local mirror to what is published: download the files the manifests name
        (once: names are immutable), then the manifests; drop manifests no longer published."""
        pubs = self.manifests()
        (self.mirror / MANIFESTS).mkdir(parents=True, exist_ok=True)
        for rid, pub in pubs.items():
            for f in pub.tables.values():
                dst = self.mirror / f.path
                if dst.exists() and dst.stat().st_size == f.bytes:
                    continue
                dst.parent.mkdir(parents=True, exist_ok=True)
                tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp")
                self._call(pafs.copy_files, self.key(f.path), str(tmp), source_filesystem=self.fs,
                           destination_filesystem=pafs.LocalFileSystem())
                os.replace(tmp, dst)
            local = self.mirror / MANIFESTS / f"{rid}.json"
            text = pub.to_json()
            if not local.exists() or local.read_text() != text:
                tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex[:8]}.tmp")
                tmp.write_text(text)
                os.replace(tmp, local)  # files first, manifest last: the mirror is never half a run
        for p in (self.mirror / MANIFESTS).glob("*.json"):
            if p.stem not in pubs:
                p.unlink(missing_ok=True)
        return self.mirror

    # ------------------------------------------------------------ writing

    @contextmanager
    def lease(self, run_id: str, wait_s: float, ttl_s: float = LEASE_TTL_S) -> Iterator[None]:
        """Hold the run's writer lease (see the module notes for what it can and cannot promise)."""
        rel = f"{LOCKS}/{run_id}.lease"
        key = self.object_key(rel)
        cas = self._conditional()
        atomic = self._call_store(cas.honoured, self.object_key(LOCKS))
        me = uuid.uuid4().hex
        deadline = time.monotonic() + wait_s
        while True:
            now = time.time()
            doc = json.dumps({"owner": me, "host": socket.gethostname(), "pid": os.getpid(), "since": now,
                              "expires": now + ttl_s}).encode()
            cur = self._call_store(cas.read, key)
            holder = _lease_doc(cur)
            if cur is None:
                held = self._call_store(cas.create, key, doc)
            elif _free(holder, now):
                held = self._call_store(cas.replace, key, doc, cur[1])
            else:
                held = None
            if held is not None and not atomic:
                time.sleep(LEASE_SETTLE_S)  # the store ignores conditions: a writer that raced us has overwritten it by now
                back = self._call_store(cas.read, key)
                held = back[1] if back is not None and (_lease_doc(back) or {}).get("owner") == me else None
            if held is not None:
                break
            if _free(holder, now):
                continue  # lost a race for a free lease: read the winner's at once (to wait on it, or to name it)
            if time.monotonic() >= deadline:
                raise RunLocked(f"run {run_id} is being written by pid {holder.get('pid')} on {holder.get('host')} "
                                f"(lease {self.url}/{rel}); try again later")
            time.sleep(0.5)
        try:
            yield
        finally:
            # only our own version: after an expiry another writer may hold it now
            if atomic:
                self._call_store(cas.delete, key, held)
            elif (_lease_doc(self._call_store(cas.read, key)) or {}).get("owner") == me:
                self._call_store(cas.delete_any, key)

    def object_key(self, rel: str) -> str:
        """``rel``'s key inside the bucket."""
        return "/".join(p for p in (self.prefix, rel) if p)

    def _conditional(self) -> ConditionalStore:
        if self._cas is None:
            self._cas = ConditionalStore(self.bucket)
        return self._cas

    def _call_store(self, fn, *args):  # noqa: ANN001, ANN202 - a thin error-translating wrapper
        try:
            return fn(*args)
        except StoreRequestError as exc:
            raise describe(self.url, exc) from exc

    def publish(self, local_root: Path, run_id: str) -> PublishedRun:
        """Upload the run version published in the local warehouse ``local_root``: its files
        first, then its manifest (the moment it becomes visible), then remove the run's files the
        manifest does not name. The caller holds the run's lease."""
        pub = read_published(local_root, run_id)
        if pub is None:
            raise FileNotFoundError(f"run {run_id} is not published in {local_root}")
        for f in pub.tables.values():
            self._call(pafs.copy_files, str(local_root / f.path), self.key(f.path),
                       source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs)
        kill_point("uploaded")
        self._put(f"{MANIFESTS}/{run_id}.json", pub.to_json().encode())
        kill_point("published")
        keep = {f.path for f in pub.tables.values()}
        for t in TABLES:
            d = f"parquet/{t}/run_id={run_id}"
            for info in self._list(d):
                if f"{d}/{info.base_name}" not in keep:
                    self._call(self.fs.delete_file, info.path)
        return pub
