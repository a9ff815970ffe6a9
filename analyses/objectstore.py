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
cannot delete its successor's. The lease lives :data:`LEASE_TTL_S` (a minute) and a heartbeat
thread renews it every :data:`LEASE_TTL_S` / 3 while the writer lives (the same conditional
replace), so a writer that dies blocks its run for at most about a minute, and one that stalls
past its expiry finds the lease gone when it renews it right before its manifest ``PUT`` and
publishes nothing (:class:`LeaseLost`). ``$POLYTRACE_S3_LEASE_TTL`` and
``$POLYTRACE_S3_LEASE_HEARTBEAT`` (seconds) set both. The run's next publish aborts the
multipart uploads a dead writer left unfinished under the run's keys (invisible objects that
S3 keeps, and bills, until aborted) and deletes the files no manifest names. On a store that ignores the
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
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from analyses.conditional_writes import ConditionalStore, StoreRequestError
from analyses.schema import TABLES
from analyses.warehouse import MANIFESTS, PublishedRun, RunLocked, kill_point, read_published

if TYPE_CHECKING:  # pyarrow's S3 client only once a store is used: every warehouse command imports this module
    import pyarrow.fs as pafs

SCHEME = "s3://"
ENV_CACHE = "POLYTRACE_CACHE"
LEASE_TTL_S = 60.0
ENV_LEASE_TTL = "POLYTRACE_S3_LEASE_TTL"
ENV_LEASE_HEARTBEAT = "POLYTRACE_S3_LEASE_HEARTBEAT"  # default: a third of the TTL
LEASE_SETTLE_S = 0.5
LOCKS = ".locks"
UPLOAD_CHUNK = 8 << 20


class StoreError(Exception):
    """The object store cannot be used: unreachable endpoint, refused credentials, missing bucket."""


class LeaseLost(RunLocked):
    """The writer's lease lapsed (it stalled past its expiry) or was taken over: it must not publish."""


def _seconds(env: str, default: float) -> float:
    raw = os.environ.get(env)
    if raw is None or not raw.strip():
        return default
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise StoreError(f"${env}={raw!r}: expected a positive number of seconds")
    return v


def lease_timing(ttl_s: float | None = None, heartbeat_s: float | None = None) -> tuple[float, float]:
    """The lease's time to live and heartbeat interval: the arguments, else ``$POLYTRACE_S3_LEASE_TTL``
    (default :data:`LEASE_TTL_S`) and ``$POLYTRACE_S3_LEASE_HEARTBEAT`` (default a third of the TTL)."""
    ttl = ttl_s if ttl_s is not None else _seconds(ENV_LEASE_TTL, LEASE_TTL_S)
    beat = heartbeat_s if heartbeat_s is not None else _seconds(ENV_LEASE_HEARTBEAT, ttl / 3)
    return ttl, beat


class HeldLease:
    """A writer's lease, renewed by a heartbeat thread until :meth:`stop`. A renewal is the same
    conditional replace as a take-over (``If-Match`` the version we wrote last), so once another
    writer has taken the lease over no renewal can take it back: the lease is then :attr:`lost`."""

    def __init__(self, store: ObjectWarehouse, run_id: str, key: str, etag: str, doc: dict, ttl_s: float,
                 heartbeat_s: float, atomic: bool) -> None:
        self.store, self.run_id, self.key, self.etag = store, run_id, key, etag
        self.doc, self.ttl_s, self.heartbeat_s, self.atomic = doc, ttl_s, heartbeat_s, atomic
        self.expires = float(doc["expires"])
        self.lost: str | None = None
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if ttl_s > 0:  # a lease with no life (tests of take-over) has nothing to keep alive
            self._thread = threading.Thread(target=self._beat, name=f"lease-{run_id}", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.renew()
            if self.lost:
                return

    def renew(self) -> bool:
        """Push the expiry a TTL ahead; False (and :attr:`lost` set) when the lease is no longer ours.
        A failed request is retried at the next beat, unless the lease expired meanwhile."""
        with self._mutex:
            if self.lost:
                return False
            now = time.time()
            doc = {**self.doc, "expires": now + self.ttl_s, "renewed": now}
            cas = self.store._conditional()
            try:
                if self.atomic:
                    new = cas.replace(self.key, json.dumps(doc).encode(), self.etag)
                else:  # the store ignores If-Match: read back, then overwrite only our own
                    cur = cas.read(self.key)
                    mine = cur is not None and (_lease_doc(cur) or {}).get("owner") == doc["owner"]
                    new = cas.replace(self.key, json.dumps(doc).encode(), cur[1]) if mine and cur else None
                taken = new is None and cas.read(self.key) is not None
            except Exception as exc:  # noqa: BLE001 - on the heartbeat thread: any failure is a missed beat
                if time.time() >= self.expires:
                    self.lost = f"it could not be renewed before it expired ({str(exc).splitlines()[0][:120]})"
                return self.lost is None
            if new is None:
                self.lost = "another writer took it over after it expired" if taken else "it was removed"
                return False
            self.etag, self.expires = new, doc["expires"]
            return True

    def confirm(self) -> None:
        """Renew now and raise :class:`LeaseLost` unless the lease is still ours: called right
        before the manifest ``PUT``, so a writer that stalled past its expiry publishes nothing."""
        if not self.renew() or time.time() >= self.expires:
            raise LeaseLost(f"run {self.run_id}: not published: this writer's lease {self.store.url}/{LOCKS}/"
                            f"{self.run_id}.lease lapsed ({self.lost or 'expired'}); ingest it again")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def is_object_url(location: str | os.PathLike[str] | None) -> bool:
    return location is not None and str(location).startswith(SCHEME)


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def s3_filesystem() -> pafs.S3FileSystem:
    """pyarrow's S3 client configured from the standard AWS variables; it fails fast (one attempt,
    short timeouts) so a wrong endpoint is an error in seconds, not a hang."""
    import pyarrow.fs as pafs

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
        import pyarrow.fs as pafs

        sel = pafs.FileSelector(self.key(rel), allow_not_found=True, recursive=False)
        return [i for i in self._call(self.fs.get_file_info, sel) if i.type == pafs.FileType.File]

    # ------------------------------------------------------------ reading

    def check(self) -> None:
        """Raise :class:`StoreError` unless the endpoint answers, the credentials work and the bucket exists."""
        import pyarrow.fs as pafs

        if self._call(self.fs.get_file_info, self.bucket).type == pafs.FileType.NotFound:
            raise StoreError(f"warehouse {self.url}: the bucket does not exist")
        self._list(MANIFESTS)

    def published(self, run_id: str) -> PublishedRun | None:
        """Run ``run_id``'s manifest (one GET), None when it is not published or cannot be read."""
        data = self._get(f"{MANIFESTS}/{run_id}.json")
        try:
            return PublishedRun.from_json(data.decode()) if data else None
        except (ValueError, KeyError):
            return None

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
        import pyarrow.fs as pafs

        pubs = self.manifests()
        (self.mirror / MANIFESTS).mkdir(parents=True, exist_ok=True)
        for rid, pub in pubs.items():
            for f in pub.files():
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
    def lease(self, run_id: str, wait_s: float, ttl_s: float | None = None,
              heartbeat_s: float | None = None) -> Iterator[HeldLease]:
        """Hold the run's writer lease, renewed while the block runs (see the module notes for what
        it can and cannot promise); ``ttl_s`` / ``heartbeat_s`` default to :func:`lease_timing`."""
        ttl, beat = lease_timing(ttl_s, heartbeat_s)
        rel = f"{LOCKS}/{run_id}.lease"
        key = self.object_key(rel)
        cas = self._conditional()
        atomic = self._call_store(cas.honoured, self.object_key(LOCKS))
        me = uuid.uuid4().hex
        deadline = time.monotonic() + wait_s
        while True:
            now = time.time()
            mine = {"owner": me, "host": socket.gethostname(), "pid": os.getpid(), "since": now, "expires": now + ttl}
            doc = json.dumps(mine).encode()
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
            time.sleep(min(0.5, max(0.05, float(holder.get("expires", 0)) - time.time())))
        lease = HeldLease(self, run_id, key, held, mine, ttl, beat, atomic)
        try:
            yield lease
        finally:
            lease.stop()
            # only our own version: after an expiry another writer may hold it now
            if atomic:
                self._call_store(cas.delete, key, lease.etag)
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

    def publish(self, local_root: Path, run_id: str, lease: HeldLease | None = None) -> PublishedRun:
        """Upload the run version published in the local warehouse ``local_root``: its files
        first, then its manifest (the moment it becomes visible), then remove what earlier writers
        of the run left: files the manifest does not name and unfinished multipart uploads. The
        caller holds the run's ``lease``, confirmed right before the manifest ``PUT``
        (:class:`LeaseLost` if it lapsed: nothing is published)."""
        pub = read_published(local_root, run_id)
        if pub is None:
            raise FileNotFoundError(f"run {run_id} is not published in {local_root}")
        for name, segs in pub.tables.items():
            for f in segs:
                self._upload(local_root / f.path, f.path, name)
        kill_point("uploaded")
        if lease is not None:
            lease.confirm()
        self._put(f"{MANIFESTS}/{run_id}.json", pub.to_json().encode())
        kill_point("published")
        self.remove_unnamed(run_id, {self.object_key(f.path) for f in pub.files()})
        self.abort_unfinished_uploads(run_id)
        return pub

    def remove_unnamed(self, run_id: str, keep: set[str]) -> list[str]:
        """Delete every object under the run's partitions but ``keep`` (the manifest's keys): the
        files of replaced versions and of dead writers, and the empty ``.../`` directory markers
        some tools leave (pyarrow's ``delete_file`` creates one for the parent it empties: deleting
        through boto3 leaves none). Returns the keys deleted."""
        client = self._conditional().client
        gone = []
        for t in TABLES:
            prefix = self.object_key(f"parquet/{t}/run_id={run_id}/")
            for k in self._call_store(_list_keys, client, self.bucket, prefix):
                if k not in keep:
                    self._call_store(_delete_key, client, self.bucket, k)
                    gone.append(k)
        return gone

    def _upload(self, src: Path, rel: str, table: str) -> None:
        """``src`` to the object ``rel`` (pyarrow's output stream: a multipart upload, its parts
        sent in the background)."""
        def write() -> None:
            with open(src, "rb") as fh, self.fs.open_output_stream(self.key(rel)) as out:
                while chunk := fh.read(UPLOAD_CHUNK):
                    out.write(chunk)
                    kill_point(f"uploading:{table}")
        self._call(write)

    def abort_unfinished_uploads(self, run_id: str) -> list[str]:
        """Abort the multipart uploads under the run's keys (its table files and its manifest) that
        no one will finish: a writer killed mid-upload leaves them, invisible to listings of
        objects, until aborted. Only under the run's lease: then no live writer is uploading there.
        Returns the keys aborted."""
        client = self._conditional().client
        parquet = self.object_key("parquet/")
        manifest = self.object_key(f"{MANIFESTS}/{run_id}.json")
        segment = f"/run_id={run_id}/"
        aborted = []
        for prefix in (parquet, manifest):
            for upload in self._call_store(_list_uploads, client, self.bucket, prefix):
                k = upload["Key"]
                if k == manifest or (k.startswith(parquet) and segment in k[len(parquet) - 1:]):
                    self._call_store(_abort_upload, client, self.bucket, k, upload["UploadId"])
                    aborted.append(k)
        return aborted


def _request(client, op: str, **kw: object) -> dict:  # noqa: ANN001 - a boto3 client
    """``client.<op>(**kw)`` with boto3's failures as :class:`StoreRequestError` (one line)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return getattr(client, op)(**kw)
    except (ClientError, BotoCoreError) as exc:
        raise StoreRequestError(f"{op} {kw.get('Key') or kw.get('Prefix') or ''}: {exc}") from exc


def _delete_key(client, bucket: str, key: str) -> None:  # noqa: ANN001 - a boto3 client
    _request(client, "delete_object", Bucket=bucket, Key=key)


def _list_keys(client, bucket: str, prefix: str) -> list[str]:  # noqa: ANN001 - a boto3 client
    out: list[str] = []
    token: dict = {}
    while True:
        page = _request(client, "list_objects_v2", Bucket=bucket, Prefix=prefix, **token)
        out += [o["Key"] for o in page.get("Contents") or []]
        if not page.get("IsTruncated"):
            return out
        token = {"ContinuationToken": page["NextContinuationToken"]}


def _list_uploads(client, bucket: str, prefix: str) -> list[dict]:  # noqa: ANN001 - a boto3 client
    out: list[dict] = []
    token: dict = {}
    while True:
        page = _request(client, "list_multipart_uploads", Bucket=bucket, Prefix=prefix, **token)
        out += page.get("Uploads") or []
        if not page.get("IsTruncated"):
            return out
        token = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}


def _abort_upload(client, bucket: str, key: str, upload_id: str) -> None:  # noqa: ANN001 - a boto3 client
    try:
        _request(client, "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
    except StoreRequestError as exc:
        if "NoSuchUpload" not in str(exc):  # finished or aborted meanwhile
            raise
