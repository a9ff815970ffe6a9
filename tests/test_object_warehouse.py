"""A warehouse on a real S3-compatible server (moto's standalone server, a separate process on
127.0.0.1): ingest → query → runs → report → fit give what the same steps give on local disk;
an unusable store is a one-line usage error; a publish killed before its manifest shows nothing;
the writer lease is a compare-and-swap on the server (and best effort behind a proxy that drops
the conditions, as some S3-compatible servers do)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from _warehouse_util import assert_same_tables, free_port, wait_for_port

from analyses.api import PolyTrace
from analyses.cli import main
from analyses.schema import TABLES
from analyses.warehouse import ENV_KILL_AT

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "sample_logs"


@contextmanager
def moto_server(**env: str) -> Iterator[str]:
    """moto's S3 server on a free port, stopped (its process group) on exit."""
    pytest.importorskip("moto")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for_port(port, proc, 30, "the moto server")
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


# one worker runs the module: its module fixture (the moto S3 server) is built once, not on each worker
pytestmark = pytest.mark.xdist_group("object_warehouse")


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def s3_env(s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The standard AWS variables pointing at the server, a fresh bucket, a private mirror cache."""
    for k, v in {"AWS_ENDPOINT_URL": s3_server, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                 "POLYTRACE_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(k, v)
    bucket = f"wh-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    pafs.S3FileSystem(endpoint_override=s3_server, scheme="http", access_key="testing", secret_key="testing",
                      region="us-east-1", allow_bucket_creation=True).create_dir(bucket)
    return bucket


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_s3_round_trip_matches_local_disk(s3_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, local = f"s3://{s3_env}/team/wh", str(tmp_path / "local")
    for wh in (url, local):
        assert _cli(["ingest", "--root", str(LOGS), "--warehouse", wh, "-q"], capsys)[0] == 0
    # the tables, read back through a fresh reader's mirror
    assert_same_tables(PolyTrace(url)._sync(), Path(local))
    sql = "SELECT run_id, count(*) AS n, sum(response_tokens) AS r FROM samples GROUP BY 1 ORDER BY 1; " \
          "SELECT run_id, count(*) FROM steps GROUP BY 1 ORDER BY 1"
    q = {wh: _cli(["query", sql, "--format", "json", "--warehouse", wh], capsys) for wh in (url, local)}
    assert q[url][0] == 0 and q[url][1] == q[local][1] and "polytrace-math-dapo" in q[url][1]
    runs = {wh: _cli(["runs", "--warehouse", wh], capsys)[1] for wh in (url, local)}
    assert runs[url] == runs[local] and runs[url].count("\n") == 5
    for i, wh in enumerate((url, local)):
        rc, out, _ = _cli(["report", "--warehouse", wh, "--no-png", "--out", str(tmp_path / f"r{i}.html")], capsys)
        assert rc == 0 and (tmp_path / f"r{i}.html").stat().st_size > 10_000
    # a run fitted from its samples and one from its per-step summaries: both read paths of the fit (all
    # five runs fitted twice were half of this test's minute; their tables are equal, asserted above)
    specs, fitted = [], ["polytrace-math-dapo", "verl-gsm8k-ppo-v0.1"]
    for i, wh in enumerate((url, local)):
        argv = ["fit", "--warehouse", wh, "-q", "--runs", *fitted, "--out", str(tmp_path / f"s{i}.json")]
        assert _cli(argv, capsys)[0] == 0
        specs.append(json.loads((tmp_path / f"s{i}.json").read_text())["workloads"])
    assert specs[0] == specs[1] and sorted(specs[0]) == fitted


def test_s3_parallel_ingest_matches_serial(s3_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"s3://{s3_env}/par"
    assert _cli(["ingest", "--root", str(LOGS), "--warehouse", url, "-q", "--workers", "2"], capsys)[0] == 0
    assert _cli(["ingest", "--root", str(LOGS), "--warehouse", str(tmp_path / "local"), "-q"], capsys)[0] == 0
    assert_same_tables(PolyTrace(url)._sync(), tmp_path / "local")


def test_reingest_on_s3_replaces_the_version_and_removes_the_old_files(s3_env: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    url = f"s3://{s3_env}/re"
    run = LOGS / "verl-gsm8k-ppo-v0.1"
    for _ in range(2):
        assert _cli(["ingest", str(run), "--warehouse", url, "-q"], capsys)[0] == 0
    fs = PolyTrace(url).store.fs
    files = [i for i in fs.get_file_info(pafs.FileSelector(f"{s3_env}/re/parquet", recursive=True))
             if i.type == pafs.FileType.File]
    versions = {Path(i.path).stem for i in files}
    assert len(versions) == 1 and len(files) == len(TABLES)  # one version of every table, the first one's removed
    assert not [i for i in fs.get_file_info(pafs.FileSelector(f"{s3_env}/re/.locks", allow_not_found=True))]


def test_publish_killed_after_the_upload_shows_nothing(s3_env: str, tmp_path: Path) -> None:
    url = f"s3://{s3_env}/killed"
    env = {**os.environ, ENV_KILL_AT: "uploaded", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "analyses.cli", "ingest", str(LOGS / "verl-gsm8k-ppo-v0.1"),
                           "--warehouse", url, "-q"], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    pt = PolyTrace(url)
    assert pt.run_ids() == []  # the files are up, but no manifest names them
    fs = pt.store.fs
    assert [i for i in fs.get_file_info(pafs.FileSelector(f"{s3_env}/killed/parquet", recursive=True))
            if i.type == pafs.FileType.File]
    # the lease of the dead writer is still there; with a short TTL gone, the next ingest publishes whole
    fs.delete_file(f"{s3_env}/killed/.locks/verl-gsm8k-ppo-v0.1.lease")
    assert main(["ingest", str(LOGS / "verl-gsm8k-ppo-v0.1"), "--warehouse", url, "-q"]) == 0
    assert PolyTrace(url).run_ids() == ["verl-gsm8k-ppo-v0.1"]
    left = [i for i in fs.get_file_info(pafs.FileSelector(f"{s3_env}/killed/parquet", recursive=True))
            if i.type == pafs.FileType.File]
    assert len(left) == len(TABLES)  # the killed upload's files are gone


@pytest.mark.parametrize("case, message", [
    ("missing bucket", "the bucket does not exist"),
    ("bad endpoint", "cannot reach the endpoint"),
    ("plain http not allowed", "set AWS_ALLOW_HTTP=true"),
])
def test_unusable_store_exits_2_with_one_line_and_publishes_nothing(
        s3_env: str, case: str, message: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    url = f"s3://{s3_env}/x"
    if case == "missing bucket":
        url = "s3://no-such-bucket-here/x"
    elif case == "bad endpoint":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    else:
        monkeypatch.delenv("AWS_ALLOW_HTTP")
    for argv in (["ingest", str(LOGS / "verl-gsm8k-ppo-v0.1")], ["runs"], ["query", "SELECT 1"]):
        rc, _, err = _cli([*argv, "--warehouse", url], capsys)
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
    monkeypatch.undo()


def test_dagster_ingest_partitions_land_on_s3_as_on_disk(s3_env: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from dagster import DagsterInstance

    from pipelines.definitions import build_defs
    from pipelines.partitions import RUNS_PARTITIONS_NAME
    from pipelines.resources import WarehouseResource
    from pipelines.sensors import INGEST_JOB_NAME

    url = f"s3://{s3_env}/dagster"
    runs = ["verl-gsm8k-ppo-v0.1", "polytrace-search-multiturn"]
    defs = build_defs(WarehouseResource(root=url, logs_root=str(LOGS)))
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(RUNS_PARTITIONS_NAME, runs)
        for r in runs:
            res = defs.resolve_job_def(INGEST_JOB_NAME).execute_in_process(partition_key=r, instance=instance)
            assert res.success
    for r in runs:
        assert main(["ingest", str(LOGS / r), "--warehouse", str(tmp_path / "local"), "-q"]) == 0
    assert sorted(PolyTrace(url).run_ids()) == sorted(runs)
    assert_same_tables(PolyTrace(url).read_root(), tmp_path / "local")


def test_refused_credentials_exit_2_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # this server checks signatures against its (empty) IAM: every key is unknown
    with moto_server(INITIAL_NO_AUTH_ACTION_COUNT="0") as endpoint:
        for k, v in {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "wrong",
                     "AWS_SECRET_ACCESS_KEY": "wrong", "AWS_REGION": "us-east-1",
                     "POLYTRACE_CACHE": str(tmp_path / "cache")}.items():
            monkeypatch.setenv(k, v)
        for argv in (["ingest", str(LOGS / "verl-gsm8k-ppo-v0.1")], ["runs"]):
            rc, _, err = _cli([*argv, "--warehouse", "s3://bucket/x"], capsys)
            assert rc == 2 and "credentials were refused" in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------------------- the writer lease


def test_conditional_writes_hold_on_the_server(s3_env: str) -> None:
    from analyses.conditional_writes import ConditionalStore

    cas = ConditionalStore(s3_env)
    first = cas.create("k", b"a")
    assert first is not None and cas.create("k", b"b") is None  # If-None-Match: * on an existing key
    assert cas.read("k") == (b"a", first)
    assert cas.replace("k", b"c", '"not-its-etag"') is None
    second = cas.replace("k", b"c", first)
    assert second is not None and second != first and cas.read("k")[0] == b"c"
    assert cas.replace("k", b"d", first) is None  # the version read is gone: the replace loses
    assert not cas.delete("k", first) and cas.read("k") is not None  # not ours to delete any more
    assert cas.delete("k", second) and cas.read("k") is None
    assert cas.replace("k", b"e", second) is None and not cas.delete("k", second)  # nothing left to replace
    assert cas.honoured(".locks")


def _lease_owner(pt: PolyTrace, run_id: str) -> str | None:
    got = pt.store._conditional().read(pt.store.object_key(f".locks/{run_id}.lease"))
    return json.loads(got[0])["owner"] if got else None


def test_a_held_lease_keeps_a_second_writer_out_and_names_its_holder(s3_env: str) -> None:
    from analyses.warehouse import RunLocked

    a, b = PolyTrace(f"s3://{s3_env}/lease"), PolyTrace(f"s3://{s3_env}/lease")
    with a.store.lease("r1", wait_s=0):
        t0 = time.monotonic()
        with pytest.raises(RunLocked, match=rf"being written by pid {os.getpid()} on "), b.store.lease("r1", wait_s=1.0):
            pass
        assert time.monotonic() - t0 >= 1.0  # it waited for the lease before giving up
        with b.store.lease("r2", wait_s=0):  # another run's lease is another object
            pass
    with b.store.lease("r1", wait_s=0):  # given back: the next writer takes it at once
        assert _lease_owner(b, "r1") is not None
    assert _lease_owner(b, "r1") is None


def test_an_expired_lease_is_taken_over_and_its_old_holder_leaves_it_alone(s3_env: str) -> None:
    a, b = PolyTrace(f"s3://{s3_env}/expiry"), PolyTrace(f"s3://{s3_env}/expiry")
    held_by_a = a.store.lease("r", wait_s=0, ttl_s=0.0)  # expired as soon as taken: a writer slower than its TTL
    held_by_a.__enter__()
    old = _lease_owner(a, "r")
    held_by_b = b.store.lease("r", wait_s=0)  # taken over at once, not waited for
    held_by_b.__enter__()
    new = _lease_owner(b, "r")
    assert old is not None and new is not None and new != old
    held_by_a.__exit__(None, None, None)
    assert _lease_owner(b, "r") == new  # a's release deleted only its own version: b's lease stays
    held_by_b.__exit__(None, None, None)
    assert _lease_owner(b, "r") is None


def test_of_two_writers_that_find_the_lease_free_only_one_takes_it(s3_env: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The race, made to happen: b's lease lands between a's read (free) and a's write."""
    from analyses.warehouse import RunLocked

    a, b = PolyTrace(f"s3://{s3_env}/race"), PolyTrace(f"s3://{s3_env}/race")
    cas_a, key = a.store._conditional(), a.store.object_key(".locks/r.lease")
    real_read = cas_a.read

    def read_then_b_writes(k: str) -> tuple[bytes, str] | None:
        got = real_read(k)
        if got is None:
            doc = {"owner": "b", "host": "elsewhere", "pid": 1, "since": time.time(), "expires": time.time() + 60}
            assert b.store._conditional().create(key, json.dumps(doc).encode()) is not None
        return got

    monkeypatch.setattr(cas_a, "read", read_then_b_writes)
    with pytest.raises(RunLocked, match="pid 1 on elsewhere"), a.store.lease("r", wait_s=0):
        pass
    assert _lease_owner(b, "r") == "b"  # a's write was refused, not laid over b's


@contextmanager
def proxy_dropping_conditions(upstream: str) -> Iterator[str]:
    """An HTTP proxy to ``upstream`` that drops If-Match and If-None-Match from every request: an
    S3-compatible server that ignores conditional writes."""
    import http.client
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit

    up = urlsplit(upstream)

    class Forward(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("if-match", "if-none-match")}
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_PUT = do_DELETE = do_HEAD = do_POST = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_store_that_ignores_conditions_gets_the_settled_lease(s3_env: str, s3_server: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from analyses import objectstore
    from analyses.conditional_writes import ConditionalStore
    from analyses.warehouse import RunLocked

    with proxy_dropping_conditions(s3_server) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        cas = ConditionalStore(s3_env)
        assert cas.create("k", b"a") is not None and cas.create("k", b"b") is not None  # both "succeed"
        assert not cas.honoured(".locks")
        a, b = PolyTrace(f"s3://{s3_env}/plain"), PolyTrace(f"s3://{s3_env}/plain")
        t0 = time.monotonic()
        with a.store.lease("r", wait_s=0):
            assert time.monotonic() - t0 >= objectstore.LEASE_SETTLE_S  # written, waited, read back
            with pytest.raises(RunLocked, match=f"pid {os.getpid()}"), b.store.lease("r", wait_s=0):
                pass  # a live lease still keeps a second writer out
        assert _lease_owner(b, "r") is None


@pytest.mark.parametrize("case, message", [
    ("missing bucket", "the bucket does not exist"),
    ("bad endpoint", "cannot reach the endpoint"),
])
def test_the_lease_requests_fail_with_one_line(s3_env: str, case: str, message: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease's requests go through boto3, not pyarrow: their failures read the same."""
    from analyses.objectstore import ObjectWarehouse, StoreError

    url = f"s3://{s3_env}/x"
    if case == "missing bucket":
        url = "s3://no-such-bucket-here/x"
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StoreError) as err, ObjectWarehouse(url).lease("r", wait_s=0):
        pass
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1


# ---------------------------------------------------------------------------- a dead writer, a live one


def _unfinished_uploads(pt: PolyTrace) -> list[str]:
    client = pt.store._conditional().client
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=pt.store.bucket,
                                                            Prefix=pt.store.prefix).get("Uploads") or []]


def _objects(pt: PolyTrace, under: str) -> list[str]:
    client = pt.store._conditional().client
    got = client.list_objects_v2(Bucket=pt.store.bucket, Prefix=pt.store.object_key(under))
    return sorted(o["Key"] for o in got.get("Contents") or [])


@pytest.mark.parametrize("kill_at", ["uploaded", "uploading:samples"], ids=["after-its-upload", "mid-upload"])
def test_a_dead_writers_lease_lapses_in_seconds_and_its_leftovers_go_at_the_next_publish(
        s3_env: str, kill_at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer SIGKILLed holding its lease, after uploading its files or in the middle of one (an
    unfinished multipart upload): with a 2 s lease renewed every 0.5 s, the next ingest gets in
    within seconds, not an hour, and its publish leaves nothing of the dead one's: no unnamed
    object, no unfinished upload, no lease."""
    url = f"s3://{s3_env}/dead"
    run = LOGS / "polytrace-math-dapo"
    timing = {"POLYTRACE_S3_LEASE_TTL": "2", "POLYTRACE_S3_LEASE_HEARTBEAT": "0.5"}
    env = {**os.environ, **timing, ENV_KILL_AT: kill_at, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "analyses.cli", "ingest", str(run), "--warehouse", url, "-q"],
                          env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    pt = PolyTrace(url)
    assert _lease_owner(pt, run.name) is not None and _objects(pt, "parquet/")
    assert len(_unfinished_uploads(pt)) == (kill_at != "uploaded")
    for k, v in timing.items():
        monkeypatch.setenv(k, v)
    t0 = time.monotonic()
    assert main(["ingest", str(run), "--warehouse", url, "-q", "--wait", "30"]) == 0
    assert time.monotonic() - t0 < 25  # the lease lapsed within its 2 s TTL (plus the ingest itself)
    published = {pt.store.object_key(f.path) for f in PolyTrace(url).store.manifests()[run.name].files()}
    assert set(_objects(pt, "parquet/")) == published
    assert _unfinished_uploads(pt) == [] and _objects(pt, ".locks/") == []


def test_a_live_writer_keeps_its_lease_past_its_ttl(s3_env: str) -> None:
    from analyses.warehouse import RunLocked

    a, b = PolyTrace(f"s3://{s3_env}/alive"), PolyTrace(f"s3://{s3_env}/alive")
    with a.store.lease("r", wait_s=0, ttl_s=1.0, heartbeat_s=0.2):
        end = time.monotonic() + 3.0  # three TTLs
        tries = 0
        while time.monotonic() < end:
            with pytest.raises(RunLocked, match=f"pid {os.getpid()}"), b.store.lease("r", wait_s=0):
                pass
            tries += 1
            time.sleep(0.25)
        assert tries >= 5
    assert _lease_owner(b, "r") is None  # given back at the end


def test_a_writer_that_stalled_past_its_expiry_publishes_nothing(s3_env: str, tmp_path: Path) -> None:
    from analyses.ingest import ingest_run
    from analyses.objectstore import LeaseLost

    url = f"s3://{s3_env}/stalled"
    run = LOGS / "verl-gsm8k-ppo-v0.1"
    ingest_run(run, tmp_path / "local")
    a, b = PolyTrace(url), PolyTrace(url)
    # a heartbeat slower than the TTL: a writer paused (GC, a suspended VM) for longer than its lease
    with a.store.lease(run.name, wait_s=0, ttl_s=0.5, heartbeat_s=60) as held:
        time.sleep(0.7)
        with b.store.lease(run.name, wait_s=0):  # another writer takes the expired lease over
            pass
        with pytest.raises(LeaseLost, match="lapsed"):
            a.store.publish(tmp_path / "local", run.name, lease=held)
    assert PolyTrace(url).run_ids() == []  # its files may be up, but no manifest names them
