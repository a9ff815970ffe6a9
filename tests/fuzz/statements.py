"""Fuzz statements for the query sandbox: SQL inputs that mix every statement type DuckDB's parser
knows (``duckdb.StatementType``) -- queries, COPY, EXPORT/IMPORT, ATTACH/DETACH, PRAGMA, SET/RESET,
INSTALL/LOAD, CALL, CREATE (... AS), INSERT, UPDATE, DELETE, MERGE, ALTER, DROP, PREPARE/EXECUTE,
transactions, VACUUM/ANALYZE/CHECKPOINT -- each also under EXPLAIN, EXPLAIN ANALYZE and EXPLAIN
(options); with CTEs, nested subqueries, table functions reading paths inside and outside the
warehouse, COPY to the published files and to paths outside it, queries that exceed the memory or
time limits, ``--`` and ``/* */`` comments between any two tokens, mixed case, and several
statements per input (some cut short).

Each input is a pure function of ``(master seed, index)`` and the fuzz environment (:class:`Env`:
the warehouse, the canary files beside it), so ``python -m tests.fuzz.sql_run --show SEED:INDEX``
prints any input again.

The environment watches for what the sandbox must never do: every file under its root is
snapshotted (writes: size, mtime, inode; sha256 at the end), and canary tokens sit in the
contents of files outside the published ones, in names never written in any statement (a
directory listing would show them) and in the environment (``/proc/self/environ``): a token
in any output is a read outside the published files.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[2]
SAMPLE_LOGS = REPO / "sample_logs"
ENV_CANARY = "POLYTRACE_FUZZ_CANARY"
MANIFEST_TEXT = "polytrace-run/1"  # in every manifest and nowhere else
PASSWD_TEXT = "root:x:0:0"


@dataclass(frozen=True)
class Env:
    root: str  # everything the fuzz watches
    wh: str  # the warehouse, built from sample_logs
    outside: str  # canary files beside the warehouse
    published: tuple[str, ...]  # absolute paths of the published Parquet files
    unpublished: tuple[str, ...]  # files in the warehouse no statement may read (manifests, catalog, strays)
    canaries: tuple[str, ...]  # files outside the warehouse, each holding a token
    tokens: tuple[str, ...]  # in any output: a read outside the published files
    env_token: str  # set as $POLYTRACE_FUZZ_CANARY in the worker

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @staticmethod
    def load(path: Path) -> Env:
        d = json.loads(path.read_text())
        return Env(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def build_env(root: Path, runs: list[Path]) -> Env:
    """A warehouse of ``runs`` (sample_logs directories) under ``root``, with canaries."""
    from analyses.api import PolyTrace
    from analyses.warehouse import published_runs

    wh, outside = root / "wh", root / "outside"
    pt = PolyTrace(wh)
    for r in runs:
        pt.ingest(r, refresh=False)
    pt.refresh_catalog()
    (wh / ".scratch").mkdir()  # the scratch area: its own mtime never counts as a write
    tok = {k: f"CANARY{secrets.token_hex(8)}" for k in
           ("csv", "txt", "json", "parquet", "db", "hidden_name", "hidden", "wh_name", "wh_parquet", "notes",
            "staging", "env")}
    outside.mkdir(parents=True)
    (outside / "canary.csv").write_text(f"secret,n\n{tok['csv']},1\n")
    (outside / "canary.txt").write_text(f"{tok['txt']}\n")
    (outside / "canary.json").write_text(json.dumps({"secret": tok["json"]}) + "\n")
    (outside / "sub").mkdir()
    (outside / "sub" / f"HIDDEN{tok['hidden_name']}.csv").write_text(f"secret\n{tok['hidden']}\n")
    con = duckdb.connect()
    con.execute(f"COPY (SELECT '{tok['parquet']}' AS secret) TO '{outside / 'canary.parquet'}' (FORMAT parquet)")
    con.close()
    db = duckdb.connect(str(outside / "canary.duckdb"))
    db.execute(f"CREATE TABLE secret AS SELECT '{tok['db']}' AS secret")
    db.close()
    pub = published_runs(wh)
    published = sorted(str(wh / f.path) for r in pub.values() for f in r.files())
    # files inside the warehouse that no manifest names: a stray Parquet beside published ones
    # (its name never written in a statement), notes, a staging leftover
    part = Path(published[0]).parent
    stray = part / f"HIDDEN{tok['wh_name']}.parquet"
    con = duckdb.connect()
    con.execute(f"COPY (SELECT '{tok['wh_parquet']}' AS secret) TO '{stray}' (FORMAT parquet)")
    con.close()
    (wh / "notes.txt").write_text(f"{tok['notes']}\n")
    (wh / ".staging" / "old--run").mkdir(parents=True, exist_ok=True)
    (wh / ".staging" / "old--run" / "part.csv").write_text(f"secret\n{tok['staging']}\n")
    unpublished = sorted({str(p) for p in wh.rglob("*") if p.is_file() and str(p) not in set(published)
                          and p != stray})
    canaries = sorted(str(p) for p in outside.rglob("*") if p.is_file() and "HIDDEN" not in p.name)
    return Env(root=str(root), wh=str(wh), outside=str(outside), published=tuple(published),
               unpublished=tuple(unpublished), canaries=tuple(canaries),
               tokens=(*tok.values(), MANIFEST_TEXT, PASSWD_TEXT), env_token=tok["env"])


# ------------------------------------------------------------------------------ watching


def snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple[int, int, int, int]]:
    """(size, mtime_ns, inode, mode) of every file and directory under ``root``, but the
    ``skip`` tree (the scratch area: its files come and go with every query, and the batch's end
    checks that it is left empty)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if d / n != skip]
        for name in [*dirnames, *filenames]:
            try:
                st = os.lstat(d / name)
            except FileNotFoundError:
                continue
            out[str(d / name)] = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)
    if skip is not None:
        out.pop(str(skip), None)
    return out


def digests(root: Path, skip: Path | None = None) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        if p.is_file() and not p.is_symlink():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def changes(before: dict, after: dict) -> list[str]:
    """What differs: created, removed and changed paths."""
    out = [f"created {p}" for p in after.keys() - before.keys()]
    out += [f"removed {p}" for p in before.keys() - after.keys()]
    out += [f"changed {p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(out)


def leaks(text: str, env: Env) -> list[str]:
    return [t for t in env.tokens if t in text]


# ------------------------------------------------------------------------------ the generator


@dataclass
class Input:
    sql: str
    kinds: list[str]  # the statement kinds, for the report (EXPLAIN ANALYZE COPY, SELECT, ...)


TABLES = ("runs", "source_files", "step_metrics", "steps", "samples", "turns", "tool_calls", "rank_times",
          "gpu_samples", "filter_batches", "step_windows", "rejects")
VIEWS = ("training_health", "run_overview", "sample_lengths", "step_series", "stage_breakdown",
         "rank_imbalance", "tool_latency", "multiturn", "filter_waste")
READERS = ("read_text", "read_blob", "read_csv", "read_csv_auto", "read_parquet", "parquet_scan", "read_json",
           "read_json_auto", "read_ndjson", "read_json_objects", "parquet_metadata", "parquet_schema",
           "parquet_file_metadata", "parquet_kv_metadata", "sniff_csv", "glob")
EXPLAINS = ("EXPLAIN ", "EXPLAIN ANALYZE ", "EXPLAIN ANALYSE ", "EXPLAIN (FORMAT json) ", "EXPLAIN (ANALYZE) ",
            "EXPLAIN (ANALYZE, FORMAT json) ", "EXPLAIN (FORMAT text, ANALYZE) ", "EXPLAIN (ANALYZE false) ",
            "EXPLAIN (FORMAT graphviz) ")
COMMENT_TEXT = ("", "x", " COPY (SELECT 1) TO 'x' ", "(", ")", "((", "'", ";", "EXPLAIN ANALYZE", "--", "SELECT",
                "\tANALYZE\t", "/* nested */")


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


class _Gen:
    def __init__(self, rng: random.Random, env: Env) -> None:
        self.r, self.env = rng, env

    # -- paths
    def file(self) -> str:
        """A file that exists: published (half the time), in the warehouse but unpublished, or a canary."""
        e, r = self.env, self.r
        return r.choice(r.choice([e.published, e.published, e.unpublished, e.canaries]))

    def read_path(self) -> str:
        e, r = self.env, self.r
        wh, out = e.wh, e.outside
        choices = [
            self.file,
            self.file,
            self.file,
            lambda: f"{wh}/parquet/*/*/*.parquet",
            lambda: f"{wh}/**",
            lambda: f"{wh}/parquet/steps/*/*",
            lambda: f"{out}/*",
            lambda: f"{out}/sub/*",
            lambda: f"{out}/**/*.csv",
            lambda: f"{wh}/manifests/*.json",
            lambda: "/etc/passwd",
            lambda: "/proc/self/environ",
            lambda: "/proc/self/cmdline",
            lambda: "~/.duckdb/stored_secrets/x",
            lambda: os.path.relpath(r.choice(e.published), wh),  # relative to the worker's cwd (the warehouse)
            lambda: os.path.relpath(r.choice(e.unpublished), wh),
            lambda: f"{wh}/./parquet/../{os.path.relpath(r.choice(e.unpublished), wh)}",
            lambda: r.choice(e.published).replace("/parquet/", "/parquet/./"),
            lambda: f"{wh}/.scratch",
            lambda: "http://127.0.0.1:9/x.csv",
            lambda: "s3://polytrace-fuzz/x.parquet",
            lambda: "file://" + r.choice(e.canaries),
        ]
        return r.choice(choices)()

    def write_path(self) -> str:
        e, r = self.env, self.r
        choices = [
            self.file,
            self.file,
            self.file,
            lambda: f"{e.wh}/parquet/steps/run_id=new/x.parquet",
            lambda: f"{e.wh}/new.csv",
            lambda: f"{e.outside}/new.{r.choice(['csv', 'parquet', 'json'])}",
            lambda: f"{e.root}/escape/out.csv",
            lambda: f"{e.wh}/.scratch/x.csv",
            lambda: f"{e.wh}/manifests/{r.choice(['x', 'steps'])}.json",
            lambda: os.path.relpath(r.choice(e.published), e.wh),
        ]
        return r.choice(choices)()

    # -- queries
    def rel(self, depth: int = 0) -> str:
        r = self.r
        k = r.randrange(9 if depth < 3 else 3)
        if k == 0:
            return r.choice(TABLES)
        if k == 1:
            return r.choice(VIEWS)
        if k == 2:
            return f"range({r.choice([1, 10, 1000])})"
        if k == 3:
            return f"{r.choice(READERS)}({_q(self.read_path())})"
        if k == 4:
            paths = ", ".join(_q(self.read_path()) for _ in range(r.randint(1, 3)))
            return f"read_parquet([{paths}])"
        if k == 5:
            return _q(self.read_path())  # a replacement scan: FROM 'path'
        if k == 6:
            return f"({self.query(depth + 1)}) AS t{depth}"
        if k == 7:
            return r.choice(["duckdb_settings()", "duckdb_tables()", "duckdb_views()", "duckdb_extensions()",
                             "duckdb_secrets()", "duckdb_temporary_files()", "duckdb_databases()",
                             "pragma_version()", "pragma_database_size()", "checkpoint()", "force_checkpoint()",
                             "test_all_types()", "duckdb_logs", "which_secret('s3://b/x', 's3')",
                             f"enable_logging(storage := 'file', storage_path := {_q(self.write_path())})",
                             f"query_table({_q(r.choice(TABLES))})", "sql_auto_complete('SEL')",
                             "repeat_row(1, num_rows := 3)", "duckdb_functions()"])
        return f"query({_q(self.query(depth + 1))})"

    def query(self, depth: int = 0) -> str:
        r = self.r
        k = r.randrange(14)
        if k == 0:
            return f"SELECT * FROM {self.rel(depth)} LIMIT {r.choice([0, 1, 5, 300])}"
        if k == 1:
            return f"FROM {self.rel(depth)}"
        if k == 2:
            return f"SELECT count(*) AS n FROM {self.rel(depth)}"
        if k == 3:
            inner = self.query(depth + 1) if depth < 3 else "SELECT 1 AS x"
            return f"WITH a AS ({inner}), b AS (SELECT * FROM a) SELECT count(*) FROM b"
        if k == 4:
            inner = self.query(depth + 1) if depth < 3 else "SELECT 1"
            return f"SELECT (SELECT count(*) FROM ({inner})) AS n, EXISTS ({inner}) AS e"
        if k == 5:
            return r.choice(["VALUES (1, 'a'), (2, 'b')", "SELECT 1 AS x UNION ALL SELECT 2",
                             "SELECT INTERVAL 1 DAY AS i, [INTERVAL 2 HOUR] AS l, 1 AS a, 2 AS a",
                             "SELECT union_value(k := 1) AS u, '101'::BIT AS b", "SHOW TABLES", "SHOW ALL TABLES",
                             "SELECT current_setting('memory_limit'), current_setting('temp_directory')"])
        if k == 6:
            return f"{r.choice(['DESCRIBE', 'SUMMARIZE', 'SHOW'])} {r.choice(TABLES + VIEWS)}"
        if k == 7:
            return f"DESCRIBE {self.query(depth + 1)}" if depth < 3 else "DESCRIBE SELECT 1"
        if k == 8:
            t = r.choice(TABLES)
            return f"SELECT run_id, count(*) FROM {t} GROUP BY ALL ORDER BY ALL"
        if k == 9:
            return r.choice([
                "PIVOT steps ON run_id IN ('a', 'b') USING count(*)",
                "PIVOT steps ON run_id USING count(*)",  # no IN list: a MULTI statement
                "UNPIVOT (SELECT 1 AS a, 2 AS b) ON a, b INTO NAME n VALUE v",
            ])
        if k == 10:  # over the time limit
            return r.choice(["SELECT sum(hash(i)) FROM range(100000000000) t(i)",
                             "SELECT count(*) FROM range(100000) a, range(100000) b"])
        if k == 11:  # over the memory limit
            return r.choice([
                "SELECT length(string_agg(s.run_id || i::VARCHAR, ',')) FROM steps s, range(5000000) t(i)",
                "SELECT len(list(i)) FROM range(200000000) t(i)",
                "SELECT count(*) FROM (SELECT md5(i::VARCHAR) AS h FROM range(20000000) t(i) ORDER BY h)",
            ])
        if k == 12:
            return f"SELECT * FROM {self.rel(depth)} WHERE 1 IN (SELECT 1 FROM {self.rel(depth + 1)})"
        return f"SELECT {r.choice(['*', '1', 'count(*)'])} FROM {self.rel(depth)}, {self.rel(depth + 1)} LIMIT 3"

    # -- statements, by the type DuckDB's parser gives them
    def statement(self, queries_only: bool = False) -> tuple[str, str]:
        """A statement and its kind (``EXPLAIN ANALYZE COPY``): any kind, or a query."""
        r = self.r
        kinds: list[tuple[str, Callable[[], str]]] = [
            ("SELECT", self.query),
            ("SELECT", self.query),
            ("SELECT", self.query),
            ("COPY", self.copy),
            ("COPY", self.copy),
            ("EXPORT", lambda: r.choice([f"EXPORT DATABASE {_q(self.write_path())}",
                                         f"EXPORT DATABASE {_q(self.env.outside + '/export')} (FORMAT parquet)",
                                         f"IMPORT DATABASE {_q(self.env.outside)}"])),
            ("ATTACH", lambda: r.choice([f"ATTACH {_q(self.write_path())} AS a",
                                         f"ATTACH {_q(self.env.outside + '/canary.duckdb')} AS c (READ_ONLY)",
                                         f"ATTACH {_q(self.env.wh + '/polytrace.duckdb')} AS cat",
                                         "ATTACH ':memory:' AS m", "DETACH m", "USE m",
                                         "COPY FROM DATABASE memory TO m"])),
            ("PRAGMA", lambda: r.choice(["PRAGMA version", "PRAGMA database_size", "PRAGMA enable_profiling='json'",
                                         f"PRAGMA profiling_output={_q(self.write_path())}",
                                         "PRAGMA memory_limit='100GB'", "PRAGMA threads=1", "PRAGMA show_tables",
                                         "PRAGMA table_info('steps')", "PRAGMA storage_info('steps')"])),
            ("SET", lambda: r.choice(["SET enable_external_access = true", "SET allowed_paths = ['/']",
                                      "SET allowed_directories = ['/']", "SET memory_limit = '100GB'",
                                      f"SET temp_directory = {_q(self.write_path())}",
                                      "SET max_temp_directory_size = '1TB'", "SET lock_configuration = false",
                                      f"SET profiling_output = {_q(self.write_path())}",
                                      "SET enable_profiling = 'json'", "SET VARIABLE v = 1", "RESET ALL",
                                      "RESET lock_configuration", "SET GLOBAL threads = 64",
                                      "SET SESSION memory_limit = '1TB'"])),
            ("INSTALL/LOAD", lambda: r.choice(["INSTALL httpfs", "LOAD httpfs", f"LOAD {_q(self.read_path())}",
                                               "FORCE INSTALL spatial", "INSTALL x FROM 'http://127.0.0.1:9'",
                                               "UPDATE EXTENSIONS"])),
            ("CALL", lambda: r.choice(["CALL pragma_version()", "CALL checkpoint()", "CALL force_checkpoint()",
                                       f"CALL enable_logging(storage := 'file', storage_path := {_q(self.write_path())})",
                                       "CALL duckdb_settings()", f"CALL read_text({_q(self.read_path())})"])),
            ("CREATE", lambda: r.choice([f"CREATE TABLE t AS {self.query()}",
                                         "CREATE OR REPLACE VIEW steps AS SELECT 1 AS x",
                                         "CREATE TEMP TABLE x (a INT)", "CREATE MACRO m(x) AS x + 1",
                                         "CREATE SECRET (TYPE s3, KEY_ID 'a', SECRET 'b')",
                                         "CREATE PERSISTENT SECRET p (TYPE s3, KEY_ID 'a', SECRET 'b')",
                                         "CREATE SEQUENCE s", "CREATE TYPE e AS ENUM ('a')", "CREATE SCHEMA s",
                                         f"CREATE TABLE x AS FROM read_parquet({_q(self.read_path())})",
                                         "CREATE FUNCTION f(x) AS x"])),
            ("INSERT", lambda: r.choice(["INSERT INTO steps SELECT * FROM steps", "INSERT INTO t VALUES (1)",
                                         f"INSERT INTO steps BY NAME ({self.query()})"])),
            ("UPDATE", lambda: "UPDATE steps SET step = 0"),
            ("DELETE", lambda: r.choice(["DELETE FROM steps", "TRUNCATE steps"])),
            ("ALTER", lambda: r.choice(["ALTER VIEW steps RENAME TO s2", "ALTER TABLE steps ADD COLUMN c INT"])),
            ("DROP", lambda: r.choice(["DROP VIEW steps", "DROP TABLE IF EXISTS x", "DROP SECRET p",
                                       "DROP SCHEMA main CASCADE"])),
            ("MERGE", lambda: "MERGE INTO steps USING (SELECT 1 AS step) s ON steps.step = s.step "
                              "WHEN MATCHED THEN DELETE"),
            ("OTHER", lambda: r.choice(["VACUUM", "ANALYZE", "CHECKPOINT", "FORCE CHECKPOINT", "BEGIN TRANSACTION",
                                        "COMMIT", "ROLLBACK", f"PREPARE p AS {self.query()}", "EXECUTE p",
                                        "DEALLOCATE p", "DETACH DATABASE memory"])),
        ]
        kind, make = ("SELECT", self.query) if queries_only else r.choice(kinds)
        sql = make()
        if r.random() < 0.4:
            prefix = r.choice(EXPLAINS)
            if r.random() < 0.1:
                sql, kind = f"{prefix}({sql})", f"{prefix.strip()} ({kind})"
            else:
                sql, kind = prefix + sql, f"{prefix.strip()} {kind}"
        return sql, kind

    def copy(self) -> str:
        r = self.r
        opts = r.sample(["FORMAT parquet", "FORMAT csv", "FORMAT json", "USE_TMP_FILE false", "USE_TMP_FILE true",
                         "OVERWRITE true", "PER_THREAD_OUTPUT true", "PARTITION_BY (run_id)", "APPEND true",
                         "HEADER false"], r.randint(0, 3))
        target = self.write_path()
        o = f" ({', '.join(opts)})" if opts else ""
        return r.choice([f"COPY ({self.query()}) TO {_q(target)}{o}",
                         f"COPY {r.choice(TABLES)} TO {_q(target)}{o}",
                         f"COPY steps FROM {_q(self.read_path())}"])

    # -- dressing
    def dress(self, sql: str) -> str:
        """Comments between tokens, keywords in mixed case, odd whitespace."""
        r = self.r
        try:
            toks = duckdb.tokenize(sql)
        except Exception:  # noqa: BLE001 - a text the tokenizer refuses goes as it is
            return sql
        pieces, last = [], 0
        for k, (off, kind) in enumerate(toks):
            end = toks[k + 1][0] if k + 1 < len(toks) else len(sql)
            pieces.append(sql[last:off])
            text = sql[off:end]
            if kind == duckdb.token_type.keyword and r.random() < 0.3:
                body = text.rstrip()
                text = "".join(c.upper() if r.random() < 0.5 else c.lower() for c in body) + text[len(body):]
            if r.random() < 0.08:
                pieces.append(r.choice([f"/*{r.choice(COMMENT_TEXT)}*/", f"--{r.choice(COMMENT_TEXT)} */\n",
                                        f"/* {r.choice(COMMENT_TEXT)} */ ", "\n\t"]))
            pieces.append(text)
            last = end
        pieces.append(sql[last:])
        out = "".join(pieces)
        if r.random() < 0.1:
            out = f"/* lead */ {out}"
        if r.random() < 0.1:
            out = f"{out} -- trailing ;\n"
        return out


# known attacks, one in every CANNED_EVERY inputs (dressed like the others): the statement of
# issue 25 first; a COPY over a published file every fourth, so that every batch of 40 has one
CANNED = (
    ("EXPLAIN ANALYZE COPY", "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO {pub} (FORMAT parquet, USE_TMP_FILE false)"),
    ("SELECT", "SELECT * FROM read_text({canary})"),
    ("EXPORT", "EXPORT DATABASE {out_dir}"),
    ("SELECT", "SELECT * FROM glob({out_glob})"),
    ("COPY", "COPY steps TO {pub} (FORMAT parquet, USE_TMP_FILE false)"),
    ("ATTACH", "ATTACH {out_db} AS a; CREATE TABLE a.t AS SELECT 42"),
    ("SET", "SET allowed_paths = ['/']; SELECT * FROM read_text('/etc/passwd')"),
    ("CALL", "CALL enable_logging(storage := 'file', storage_path := {out_dir})"),
    ("EXPLAIN ANALYZE COPY", "EXPLAIN (ANALYZE, FORMAT json) COPY steps TO {pub} (FORMAT parquet, USE_TMP_FILE false)"),
    ("COPY", "COPY (SELECT 1 AS x) TO {out_csv}"),
    ("COPY", "COPY (SELECT 1 AS x) TO {manifest}"),
    ("SELECT", "SELECT * FROM read_csv({unpublished})"),
)
CANNED_EVERY = 10


def _canned(rng: random.Random, env: Env, index: int) -> tuple[str, str]:
    kind, sql = CANNED[(index // CANNED_EVERY) % len(CANNED)]
    return kind, sql.format(
        pub=_q(rng.choice(env.published)), canary=_q(rng.choice(env.canaries)), out_dir=_q(f"{env.outside}/export"),
        out_glob=_q(f"{env.outside}/sub/*"), out_db=_q(f"{env.outside}/new.duckdb"),
        out_csv=_q(f"{env.outside}/new.csv"), manifest=_q(f"{env.wh}/manifests/x.json"),
        unpublished=_q(rng.choice(env.unpublished)))


def make_input(master: int, index: int, env: Env) -> Input:
    """Input ``index`` of seed ``master``: one to four statements, dressed, some cut short; nearly
    half of the inputs are queries only (so that they run, and read), the others mix every kind;
    every tenth is a known attack (:data:`CANNED`)."""
    rng = random.Random(f"{master}:{index}")
    g = _Gen(rng, env)
    if index % CANNED_EVERY == 0:
        kind, sql = _canned(rng, env, index)
        return Input(g.dress(sql), [kind] * (sql.count(";") + 1))
    queries_only = rng.random() < 0.45
    stmts, kinds = [], []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 4])):
        sql, kind = g.statement(queries_only)
        stmts.append(g.dress(sql))
        kinds.append(kind)
    sql = rng.choice([";\n", "; ", ";"]).join(stmts) + rng.choice(["", ";", ";;", " ;\n"])
    if rng.random() < 0.03:
        sql = sql[:rng.randrange(1, len(sql) + 1)]
        kinds = ["CUT " + kinds[0]]
    return Input(sql, kinds)


def kind_family(kind: str) -> tuple[str, int]:
    """``EXPLAIN (ANALYZE, FORMAT json) COPY`` -> (``COPY``, 2): the statement, and 0 plain,
    1 under EXPLAIN, 2 under EXPLAIN ANALYZE (any spelling: DuckDB analyzes whatever value
    the ANALYZE option has)."""
    kind = kind.removeprefix("CUT ")
    if not kind.startswith("EXPLAIN"):
        return kind, 0
    head, _, stmt = kind.rpartition(" ")
    return stmt.strip("()"), 2 if "ANALY" in head.upper() else 1
