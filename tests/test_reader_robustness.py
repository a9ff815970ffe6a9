"""One bad record is rejected alone, one bad file fails alone, and no input costs without bound.

Each case is a fixture named after its quirk (or an input built here when its size is the
point), read through the real ingest or the reader path the ingest uses."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import polars as pl
import pytest

from analyses.ingest import ingest_run
from analyses.manifest import load_manifest
from analyses.readers import detect, limits, read_file
from analyses.readers.base import FileContext
from analyses.readers.kineto import KinetoTraceReader
from analyses.readers.verl_console import VerlConsoleReader
from analyses.warehouse import scan_table
from tests.conftest import FIXTURES


def _read(path: Path):
    reader = detect(path)
    assert reader is not None
    chunks = list(read_file(reader, FileContext("r", path, path.name, load_manifest(path.parent))))
    acc = {k: sum(getattr(c, k) for c in chunks) for k in ("lines", "rows_ok", "rows_rejected", "rows_skipped")}
    rej = [c.rejects for c in chunks if c.rejects is not None and c.rejects.height]
    rejects = pl.concat(rej) if rej else pl.DataFrame(schema={"line_no": pl.Int64, "reason": pl.String, "raw": pl.String})
    tables: dict[str, list[pl.DataFrame]] = {}
    for c in chunks:
        for t, df in c.tables.items():
            tables.setdefault(t, []).append(df)
    return reader.name, acc, rejects.sort("line_no"), {t: pl.concat(v, how="diagonal_relaxed") for t, v in tables.items()}


def _one_file_run(tmp_path: Path, name: str, data: bytes) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / name).write_bytes(data)
    return run


# ------------------------------------------------------------------------- NUL / undecodable bytes


def test_nul_bytes_reject_their_lines_not_the_file() -> None:
    path = FIXTURES / "verl_console" / "nul_bytes_in_model_loading_line.log"
    name, acc, rejects, tables = _read(path)
    assert name == "verl_console"
    # line 1 (model loading, two NULs) and line 4 (a step line with a NUL) are rejected; the
    # undecodable bytes of line 5 are replaced as before (a non-step line: skipped)
    assert acc == {"lines": 6, "rows_ok": 3, "rows_rejected": 2, "rows_skipped": 1}
    assert rejects["line_no"].to_list() == [1, 4]
    assert rejects["reason"].str.starts_with("nul_bytes").all()
    assert "\x00" not in "".join(rejects["raw"].to_list())
    assert sorted(tables["step_metrics"]["step"].unique().to_list()) == [0, 1, 3]


def test_real_binaries_are_still_refused(tmp_path: Path, warehouse: Path) -> None:
    run = _one_file_run(tmp_path, "model.bin", b"\x7fELF\x02\x01\x01" + b"\x00" * 4000 + bytes(range(256)) * 8)
    rep = ingest_run(run, warehouse)
    assert rep.files[0].status == "unsupported" and "binary" in rep.files[0].error


# ------------------------------------------------------------------------- deep nesting


def test_jsonl_record_nested_past_duckdb_limit_is_rejected_alone() -> None:
    name, acc, rejects, tables = _read(FIXTURES / "verl_jsonl" / "nested_past_128_levels.jsonl")
    assert name == "verl_jsonl"
    assert acc == {"lines": 4, "rows_ok": 2, "rows_rejected": 2, "rows_skipped": 0}
    assert rejects["line_no"].to_list() == [2, 3]
    assert rejects["reason"].str.starts_with("json_too_deep").all()
    assert sorted(tables["step_metrics"]["step"].unique().to_list()) == [1, 4]


def test_first_line_nested_5000_deep_does_not_break_the_sniffer(tmp_path: Path, warehouse: Path) -> None:
    src = FIXTURES / "polytrace" / "first_line_nested_5000_deep" / "packed_lengths_step_0.jsonl"
    name, acc, rejects, tables = _read(src)
    assert name == "polytrace_packed_lengths"
    assert acc == {"lines": 5, "rows_ok": 3, "rows_rejected": 2, "rows_skipped": 0}
    assert rejects["line_no"].to_list() == [1, 4]
    assert rejects["reason"].str.starts_with("json_too_deep").all()
    assert tables["samples"].height == 6
    rep = ingest_run(_one_file_run(tmp_path, src.name, src.read_bytes()), warehouse)
    assert rep.files[0].status == "partial"


def test_v1_step_entry_past_python_recursion_limit_is_rejected_alone(tmp_path: Path) -> None:
    path = tmp_path / "workload.json"
    path.write_text('{"1": {"input": [3], "output": [4, 5]}, "2": ' + "[" * 3000 + "]" * 3000
                    + ', "3": {"input": [1], "output": [2]}}')
    name, acc, rejects, tables = _read(path)
    assert name == "polytrace_v1"
    assert acc == {"lines": 3, "rows_ok": 2, "rows_rejected": 1, "rows_skipped": 0}
    assert rejects["line_no"].to_list() == [2] and "too deep" in rejects["reason"][0]
    assert sorted(tables["samples"]["step"].unique().to_list()) == [1, 3]


# ------------------------------------------------------------------------- Kineto


def test_kineto_nan_infinity_bad_utf8_events_are_rejected_alone() -> None:
    name, acc, rejects, tables = _read(FIXTURES / "kineto" / "nan_infinity_bad_utf8_events_rank-2.json")
    assert name == "kineto_trace"
    assert acc["lines"] == 9 and acc["rows_rejected"] == 4
    assert acc["rows_ok"] + acc["rows_rejected"] + acc["rows_skipped"] == 9
    assert rejects["line_no"].to_list() == [4, 5, 6, 7]
    assert rejects["reason"].str.starts_with("bad_event_json").all()
    rt = tables["rank_times"]
    assert rt["rank"].unique().to_list() == [2]
    # the two good kernels, [20, 120] and [70, 270] µs, overlap: their union is 250 µs of compute
    assert rt.filter(pl.col("phase") == "compute")["seconds"].sum() == pytest.approx(250e-6)


def test_kineto_event_over_the_limit_is_passed_and_rejected(tmp_path: Path) -> None:
    good = '{"ph": "X", "cat": "kernel", "name": "k", "ts": 20, "dur": 10, "args": {"stream": 7, "correlation": 1}}'
    long = '{"ph": "X", "cat": "cpu_op", "name": "' + "x" * 50_000 + '", "ts": 1, "dur": 1}'
    path = tmp_path / "rank-0.json"
    path.write_text('{"schemaVersion": 1, "traceEvents": [' + ", ".join([good, long, good, good]) + "]}")
    with limits.override(max_line_bytes=4096):
        for chunk_bytes in (1 << 20, 1000):  # the long event inside one chunk, and across many
            from analyses.readers.kineto import load_rank_events

            ev = load_rank_events(path, chunk_bytes=chunk_bytes)
            assert ev.n_events == 4 and ev.gpu.height == 3 and not ev.truncated
            assert [b[0] for b in ev.bad_blocks] == [2] and ev.bad_blocks[0][1].startswith("line_too_long")


def test_kineto_event_that_never_closes_is_read_in_linear_time(tmp_path: Path) -> None:
    # an event that never closes used to be re-scanned with every chunk (quadratic); now the scan
    # carries its state and the event is passed once over the limit: the cut is one rejected line
    head = b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"stream": 7, "correlation": 1}}, {"name": "'
    path = tmp_path / "open_rank-1.json.gz"
    path.write_bytes(gzip.compress(head + b"a" * (64 << 20), compresslevel=1))
    name, acc, rejects, _ = _read(path)
    assert name == "kineto_trace"
    assert acc == {"lines": 2, "rows_ok": 1, "rows_rejected": 1, "rows_skipped": 0}
    assert rejects["reason"][0].startswith("truncated_trace")


# ------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("final_newline", [True, False])
def test_over_long_line_is_rejected_and_streamed_past(tmp_path: Path, gz: bool, final_newline: bool) -> None:
    long = b"step:9 - " + b"a:1 - " * 2000 + b"b:2"
    data = b"step:1 - a:1\n" + long + b"\nstep:2 - a:2\n" + long + (b"\n" if final_newline else b"")
    path = tmp_path / ("x.log.gz" if gz else "x.log")
    path.write_bytes(gzip.compress(data) if gz else data)
    with limits.override(max_line_bytes=1000):
        r = VerlConsoleReader()
        chunks = list(read_file(r, FileContext("r", path, path.name, load_manifest(tmp_path))))
    acc = (sum(c.lines for c in chunks), sum(c.rows_ok for c in chunks), sum(c.rows_rejected for c in chunks))
    assert acc == (4, 2, 2)
    rej = pl.concat([c.rejects for c in chunks if c.rejects is not None])
    assert rej["line_no"].to_list() == [2, 4]
    assert rej["reason"][0] == f"line_too_long: {len(long)} bytes, over the 1000-byte line limit; not read"


def test_gzip_bomb_is_refused_with_its_reason(tmp_path: Path, warehouse: Path) -> None:
    bomb = gzip.compress(b"step:1 - a:1\n" + b"0" * (40 << 20), compresslevel=9)
    run = _one_file_run(tmp_path, "bomb.log.gz", bomb)
    (run / "good.log").write_bytes(b"step:1 - timing_s/step:2.0\n")
    with limits.override(gzip_min_cap_bytes=1 << 20):
        rep = ingest_run(run, warehouse)
    by = {f.path: f for f in rep.files}
    assert by["bomb.log.gz"].status == "error" and "gzip bomb" in by["bomb.log.gz"].error
    assert by["good.log"].status == "ok"


def test_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYTRACE_MAX_LINE_BYTES", "12345")
    assert limits.current().max_line_bytes == 12345
    with limits.override(max_line_bytes=7):
        assert limits.current().max_line_bytes == 7
    assert limits.current().max_line_bytes == 12345


# ------------------------------------------------------------------------- non-finite step times


def test_non_finite_and_absurd_step_times_are_no_windows(tmp_path: Path, warehouse: Path) -> None:
    src = FIXTURES / "verl_console" / "non_finite_step_times.log"
    rep = ingest_run(_one_file_run(tmp_path, src.name, src.read_bytes()), warehouse)
    assert rep.files[0].status == "ok"
    w = scan_table(warehouse, "step_windows").collect().sort("step")
    # inf, 1e300 and -5 are no durations: those steps fall back to the previous log line (step 1
    # has none, so no window); gen times nan and 1e300 give no rollout end
    assert w["step"].to_list() == [2, 3, 4]
    assert w["method"].to_list() == ["log_ts_previous_step"] * 2 + ["log_ts_minus_step_time"]
    assert w["rollout_end_ts"].to_list()[:2] == [None, None]


# ------------------------------------------------------------------------- per-file isolation


@pytest.mark.parametrize(
    "exc",
    [RecursionError("deep"), MemoryError(), pl.exceptions.PanicException("polars panicked"),
     UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")],
    ids=lambda e: type(e).__name__,
)
def test_any_failure_of_one_file_fails_that_file_alone(
    tmp_path: Path, warehouse: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    # fault injection into our own reader: a real polars panic cannot be provoked on demand
    real = VerlConsoleReader.read

    def read(self, ctx):
        if ctx.path.name == "bad.log":
            raise exc
        return real(self, ctx)

    monkeypatch.setattr(VerlConsoleReader, "read", read)
    run = _one_file_run(tmp_path, "bad.log", b"step:1 - a:1\n")
    (run / "good.log").write_bytes(b"step:1 - timing_s/step:2.0\nstep:2 - timing_s/step:2.0\n")
    rep = ingest_run(run, warehouse)
    by = {f.path: f for f in rep.files}
    assert by["bad.log"].status == "error" and by["bad.log"].error.startswith(type(exc).__name__)
    assert by["good.log"].status == "ok"
    assert scan_table(warehouse, "steps").collect()["step"].to_list() == [1, 2]


def test_a_sniffer_failure_fails_its_file_alone(tmp_path: Path, warehouse: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def sniff(self, head, path):
        if path.name == "bad.json":
            raise RecursionError("maximum recursion depth exceeded")
        return False

    monkeypatch.setattr(KinetoTraceReader, "sniff", sniff)
    # its head holds the Kineto signature (analyses.readers.READER_SPECS), so its sniff is asked
    run = _one_file_run(tmp_path, "bad.json", b'{"traceEvents": [], "x": 1}\n')
    (run / "good.log").write_bytes(b"step:1 - timing_s/step:2.0\n")
    rep = ingest_run(run, warehouse)
    by = {f.path: f for f in rep.files}
    assert by["bad.json"].status == "error" and "RecursionError" in by["bad.json"].error
    assert by["good.log"].status == "ok"


def test_keyboard_interrupt_still_stops_the_ingest(tmp_path: Path, warehouse: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def read(self, ctx):
        raise KeyboardInterrupt

    monkeypatch.setattr(VerlConsoleReader, "read", read)
    with pytest.raises(KeyboardInterrupt):
        ingest_run(_one_file_run(tmp_path, "a.log", b"step:1 - a:1\n"), warehouse)


def test_corrupt_tar_gz_member_fails_the_file_as_unreadable(tmp_path: Path, warehouse: Path) -> None:
    import io
    import tarfile

    rows = "".join(f"{i % 100}.0,{1662858720 + 57 * (i // 50)}.0,pod{i % 50:03d}\n" for i in range(200_000))
    body = ("value,timestamp_anon,container_ip\n" + rows).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("pod_gpu_duty_cycle_anon.csv")
        info.size = len(body)
        tf.addfile(info, io.BytesIO(body))
    good = buf.getvalue()
    for at in range(len(good) // 2, len(good)):  # the first corruption deflate itself detects
        data = bytearray(good)
        data[at : at + 16] = b"\xff" * 16
        try:
            zlib.decompressobj(31).decompress(bytes(data))
        except zlib.error as exc:
            if "check" not in str(exc):  # not a CRC error at the end: the stream breaks mid-member
                break
    rep = ingest_run(_one_file_run(tmp_path, "pod_gpu_duty_cycle_anon.tar.gz", bytes(data)), warehouse)
    f = rep.files[0]
    assert f.status == "error" and f.error.startswith("UnreadableFile"), f.error


def test_integers_past_int64_are_rejected_values(tmp_path: Path) -> None:
    # found by the fuzz: a rank or a v1 step key of 99999999999999999999999 failed the whole file
    v1 = tmp_path / "v1.json"
    v1.write_text('{"1": {"input": [3], "output": [4]}, "99999999999999999999999": {"input": [1], "output": [2]}}')
    name, acc, rejects, _ = _read(v1)
    assert (name, acc["rows_ok"], acc["rows_rejected"]) == ("polytrace_v1", 1, 1)
    assert "out of range" in rejects["reason"][0]
    trace = tmp_path / "trace_rank-3.json"
    trace.write_text('{"schemaVersion": 1, "distributedInfo": {"rank": 99999999999999999999999}, "traceEvents": ['
                     '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"stream": 7, "correlation": 1}}]}')
    name, acc, _, _ = _read(trace)
    assert name == "kineto_trace" and acc["rows_ok"] == 1
    from analyses.readers.kineto import rank_of

    assert rank_of({"distributedInfo": {"rank": 10**23}}, trace) == 3  # from the file name instead


def test_utf8_check_agrees_with_pythons_decoder_on_any_block_split() -> None:
    # the line layer's validity pass reads 8 MiB blocks: a character may be cut between two blocks
    import codecs
    import random

    from analyses.readers.lines import Utf8Check

    rng = random.Random(7)
    pieces = ["a", "\n", "é", "€", "😀", "ß\n"]
    bad = [b"\xff", b"\x80", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf"]
    for case in range(3000):
        data = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))).encode()
        if case % 2:
            at = rng.randint(0, len(data))
            data = data[:at] + rng.choice(bad) + data[at:]
        cuts = sorted(rng.sample(range(len(data) + 1), k=min(len(data) + 1, rng.randint(0, 6))))
        blocks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        check, dec = Utf8Check(), codecs.getincrementaldecoder("utf-8")("strict")
        for b in blocks:
            check.feed(b)
        try:
            for b in blocks:
                dec.decode(b)
            dec.decode(b"", final=True)
            expected = True
        except UnicodeDecodeError:
            expected = False
        assert check.valid() == expected, (data, blocks)
