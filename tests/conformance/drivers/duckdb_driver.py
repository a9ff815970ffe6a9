"""Run SQL against a PolyTrace warehouse's catalog under this environment's DuckDB and print the rows.

Imports nothing from the project: it is what a user's own DuckDB client sees when it opens
``<warehouse>/polytrace.duckdb`` (read-only, paths relative to the warehouse). Jobs:
``[{"warehouse": DIR, "queries": {NAME: SQL}}]``; prints, as its last line, one verdict per job:
``{"version": ..., "results": {NAME: {"columns": [...], "rows": [[...]]} | {"error": "..."}}}``.
Values become JSON: floats as floats (NaN/inf included), times as ISO text, Decimals as floats.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import sys
from pathlib import Path

import duckdb


def _plain(v: object) -> object:
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, (dt.datetime, dt.date, dt.time, dt.timedelta)):
        return str(v) if isinstance(v, dt.timedelta) else v.isoformat()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    return v


def run(job: dict) -> dict:
    wh = Path(job["warehouse"])
    con = duckdb.connect(str(wh / "polytrace.duckdb"), read_only=True)
    con.execute(f"SET file_search_path = '{wh}'")
    out: dict[str, dict] = {}
    for name, sql in job["queries"].items():
        try:
            cur = con.execute(sql)
            cols = [d[0] for d in cur.description]
            out[name] = {"columns": cols, "rows": [[_plain(v) for v in r] for r in cur.fetchall()]}
        except duckdb.Error as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:400]}
    con.close()
    return {"version": duckdb.__version__, "results": out}


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps([run(j) for j in jobs]))


if __name__ == "__main__":
    main()
