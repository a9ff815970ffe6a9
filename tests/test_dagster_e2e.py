"""End to end through Dagster, in process: partitions per run, every asset materialized into a
tmp_path warehouse, checks evaluated, tables as the plain library would write them."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import (
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    evaluate_automation_conditions,
)

from analyses import table_checks
from analyses.api import PolyTrace
from analyses.catalog import catalog_path
from analyses.ingest import ingest_run
from analyses.metadata import run_row_counts, table_rows
from analyses.schema import STEPS, TABLES
from analyses.warehouse import scan_table
from pipelines.definitions import CATALOG_KEY, build_defs
from pipelines.demo import main as demo_main
from pipelines.demo import materialize_all
from pipelines.partitions import RUNS_PARTITIONS_NAME, runs_by_id
from pipelines.resources import WarehouseResource
from pipelines.sensors import INGEST_JOB_NAME

REPO = Path(__file__).resolve().parents[1]
SAMPLE_LOGS = REPO / "sample_logs"

# Two tiny verl console runs whose answers are counted by hand:
# tiny-run: 3 step lines + 1 banner -> steps 1..3, step_time_s 2, 3, 1; 3 parsed, 1 skipped, 0 rejected.
# bad-run: step 1 fine; step 2 has a non-numeric value (pair dropped, line kept: 1 reject row, line
# parsed); "step:x" is not a step (1 rejected line) -> steps 1, 2; rows_rejected 1 of 3 candidate
# lines = 33% > 5%, so reject_share fails (WARN, the run still succeeds).
TINY = (
    "step:1 - timing_s/gen:1.0 - timing_s/step:2.0\nstep:2 - timing_s/gen:1.5 - timing_s/step:3.0\nsome banner\n"
    "step:3 - timing_s/gen:0.5 - timing_s/step:1.0 - response_length/mean:100\n"
)
BAD = (
    "step:1 - timing_s/gen:1.0 - timing_s/step:2.0\nstep:2 - timing_s/gen:oops - timing_s/step:3.0\n"
    "step:x - timing_s/gen:1.0\n"
)


@pytest.fixture
def tiny_logs(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    for name, text in (("tiny-run", TINY), ("bad-run", BAD)):
        (logs / name).mkdir(parents=True)
        (logs / name / "train.log").write_text(text)
    return logs


def _defs(tmp_path: Path, logs: Path):
    wh = WarehouseResource(root=str(tmp_path / "wh"), logs_root=str(logs))
    return build_defs(wh), tmp_path / "wh"


def _per_run_checks(defs) -> int:
    """Checks on runs-partitioned assets (evaluated once per run)."""
    graph = defs.resolve_asset_graph()
    return sum(1 for k in graph.asset_check_keys if graph.get(k.asset_key).partitions_def is not None)


def _mat(res, table: str):
    (ev,) = [e for e in res.get_asset_materialization_events() if e.asset_key == AssetKey(table)]
    return ev.materialization


def test_tiny_runs_end_to_end(tmp_path: Path, tiny_logs: Path) -> None:
    defs, root = _defs(tmp_path, tiny_logs)
    with DagsterInstance.ephemeral() as instance:
        # later stages (characterize, fit, export) are exercised on the demo corpus below
        result = materialize_all(defs, instance, tiny_logs, cross_run_keys=[CATALOG_KEY])
        assert result.success
        assert sorted(instance.get_dynamic_partitions(RUNS_PARTITIONS_NAME)) == ["bad-run", "tiny-run"]
        assert result.run_ids == ["bad-run", "tiny-run"]

        # tables, as written
        steps = scan_table(root, "steps").sort("run_id", "step").collect()
        assert steps.select("run_id", "step", "step_time_s").rows() == [
            ("bad-run", 1, 2.0),
            ("bad-run", 2, 3.0),
            ("tiny-run", 1, 2.0),
            ("tiny-run", 2, 3.0),
            ("tiny-run", 3, 1.0),
        ]
        sf = scan_table(root, "source_files", ["tiny-run"]).collect()
        assert sf.select("path", "format", "lines", "rows_ok", "rows_skipped").rows() == [
            ("train.log", "verl_console", 4, 3, 1)
        ]
        assert scan_table(root, "rejects", ["bad-run"]).collect().height == 2

        # one materialization per table per run, with metadata
        tiny = result.per_run["tiny-run"]
        assert {e.asset_key.to_user_string() for e in tiny.get_asset_materialization_events()} == set(TABLES)
        # the run's own fit is its own job after the ingest; a step log with length summaries but no batch size
        # cannot be fitted from them, and says what to add
        assert sorted(result.per_run_fit) == ["bad-run", "tiny-run"]
        fit = _mat(result.per_run_fit["tiny-run"], "run_workload").metadata
        assert fit["skipped"].value == (
            "tiny-run: the batch's sample count is not in the logs (no config dump with the train batch size, no "
            "token count with prompt lengths); set train_batch_size and rollout_n in run.toml")
        m = _mat(tiny, "steps")
        assert m.partition == "tiny-run"
        assert m.metadata["partition_row_count"].value == 3
        assert m.metadata["dagster/row_count"].value == 3  # the partition's, shown beside it
        assert m.metadata["table_row_count"].value >= 3  # the whole table's, every run ingested so far
        assert [c.name for c in m.metadata["dagster/column_schema"].schema.columns] == list(STEPS.columns)
        assert m.metadata["preview"].value.splitlines()[0].startswith("| run_id | step | step_time_s |")
        assert "train.log" in _mat(tiny, "source_files").metadata["files"].value
        assert _mat(tiny, "runs").metadata["source_fingerprint"].value

        # checks: 30 per run (25 on the tables, 5 health alerts); only bad-run's reject share fails, as a warning
        evals = {
            (e.asset_check_key.asset_key.to_user_string(), e.asset_check_key.name): e
            for e in result.per_run["bad-run"].get_asset_check_evaluations()
        }
        assert len(evals) == _per_run_checks(defs) == 30 and len(tiny.get_asset_check_evaluations()) == 30
        failed = {k: e for k, e in evals.items() if not e.passed}
        assert list(failed) == [("rejects", "reject_share")]
        assert failed["rejects", "reject_share"].severity == AssetCheckSeverity.WARN
        assert failed["rejects", "reject_share"].metadata["reject_share"].value == pytest.approx(
            1 / 3, abs=1e-6
        )
        assert result.checks.passed == 59 and result.checks.failed == ["bad-run rejects:reject_share (WARN)"]
        assert all(e.passed for e in tiny.get_asset_check_evaluations())

        # the cross-run job refreshed the catalog; SQL sees both runs
        assert result.cross_run is not None and result.cross_run.success
        assert _mat(result.cross_run, "warehouse_catalog").metadata["runs"].value == 2
        assert catalog_path(root).exists()
        con = PolyTrace(root).connect()
        assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 5
        con.close()

        # materializing again replaces each run's partitions rather than appending
        again = materialize_all(defs, instance, tiny_logs, cross_run_keys=[])
        assert again.success
        assert scan_table(root, "steps").collect().height == 5


def test_cross_run_assets_refresh_after_ingests(tmp_path: Path, tiny_logs: Path) -> None:
    """Declarative automation: nothing to do before any ingest; after ingests (however launched)
    the catalog and each ingested run's fit are requested, and once they ran they are not requested
    again."""
    defs, _root = _defs(tmp_path, tiny_logs)
    fit_key = AssetKey("run_workload")
    with DagsterInstance.ephemeral() as instance:
        first = evaluate_automation_conditions(defs, instance)
        catalog = first.get_num_requested(CATALOG_KEY)
        assert first.get_num_requested(fit_key) == 0  # no partition yet
        # two ingest runs, no fit, no cross-run job
        materialize_all(defs, instance, tiny_logs, cross_run_keys=[], fit=False)
        after = evaluate_automation_conditions(defs, instance, cursor=first.cursor)
        assert after.get_num_requested(CATALOG_KEY) == 1
        assert after.get_requested_partitions(fit_key) == {"bad-run", "tiny-run"}
        materialize_all(defs, instance, tiny_logs, cross_run_keys=[CATALOG_KEY])  # ingests, fits, the catalog
        settled = evaluate_automation_conditions(defs, instance, cursor=after.cursor)
        assert settled.get_num_requested(CATALOG_KEY) == 0 and settled.get_num_requested(fit_key) == 0
    assert catalog in (0, 1)  # on an empty instance a missing catalog may be requested once


def test_blocking_schema_check_stops_downstream(
    tmp_path: Path, tiny_logs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed schema check (ERROR, blocking) fails the run and the catalog is not refreshed."""
    real = table_checks.check_schema_partition

    def fake(root: Path, table: str, run_id: str) -> table_checks.CheckOutcome:
        passed, meta = real(root, table, run_id)
        return (False, {**meta, "problems": ["injected by the test"]}) if table == "steps" else (passed, meta)

    monkeypatch.setattr(table_checks, "check_schema_partition", fake)
    defs, _root = _defs(tmp_path, tiny_logs)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(RUNS_PARTITIONS_NAME, ["tiny-run"])
        res = defs.resolve_job_def(INGEST_JOB_NAME).execute_in_process(
            partition_key="tiny-run", instance=instance, raise_on_error=False
        )
    assert not res.success
    materialized = {e.asset_key.to_user_string() for e in res.get_asset_materialization_events()}
    assert materialized == set(TABLES)  # the tables landed; the catalog step did not run
    failed = [
        (e.asset_check_key.asset_key.to_user_string(), e.asset_check_key.name)
        for e in res.get_asset_check_evaluations()
        if not e.passed
    ]
    assert failed == [("steps", "schema_matches_contract")]


def test_a_run_of_nothing_fails_its_blocking_check(tmp_path: Path) -> None:
    """A directory of random bytes and two junk lines that sniff as a verl log: the tables land (the
    files say why), the blocking run_has_data check fails with each file's reason, nothing downstream
    of the run executes."""
    logs = tmp_path / "logs"
    (logs / "junk").mkdir(parents=True)
    (logs / "junk" / "blob.bin").write_bytes(bytes(range(256)) * 64)
    (logs / "junk" / "train.log").write_text("step:1 - loss:abc\nstep:2 - loss:def\n")
    defs, root = _defs(tmp_path, logs)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(RUNS_PARTITIONS_NAME, ["junk"])
        res = defs.resolve_job_def(INGEST_JOB_NAME).execute_in_process(
            partition_key="junk", instance=instance, raise_on_error=False)
    assert not res.success
    assert {e.asset_key.to_user_string() for e in res.get_asset_materialization_events()} == set(TABLES)
    failed = {(e.asset_check_key.name): e for e in res.get_asset_check_evaluations() if not e.passed}
    assert failed["run_has_data"].severity == AssetCheckSeverity.ERROR
    assert {k: e.severity for k, e in failed.items() if k != "run_has_data"} == {"reject_share": AssetCheckSeverity.WARN}
    reasons = failed["run_has_data"].metadata["files_and_reasons"].value
    assert "blob.bin: unsupported" in reasons and "train.log: no_data (read as verl_console" in reasons
    sf = scan_table(root, "source_files", ["junk"]).collect().sort("path")
    assert sf.select("path", "status").rows() == [("blob.bin", "unsupported"), ("train.log", "no_data")]


def test_a_mistyped_partition_fails_its_own_run_with_one_line(tmp_path: Path, tiny_logs: Path) -> None:
    """A partition key with no run directory (mistyped in the launch dialog): its run fails with one
    line, the key is removed from the partitions, and the real runs' checks keep their results."""
    defs, _root = _defs(tmp_path, tiny_logs)
    job = defs.resolve_job_def(INGEST_JOB_NAME)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(RUNS_PARTITIONS_NAME, ["tiny-run", "tiny-rnu"])
        good = job.execute_in_process(partition_key="tiny-run", instance=instance, raise_on_error=False)
        typo = job.execute_in_process(partition_key="tiny-rnu", instance=instance, raise_on_error=False)
        assert good.success and not typo.success
        (failure,) = [e for e in typo.all_events if e.event_type_value == "STEP_FAILURE"]
        message = failure.event_specific_data.user_failure_data.description
        assert "\n" not in message and message.startswith("no run with run id 'tiny-rnu' under ")
        assert "partition was removed" in message
        assert instance.get_dynamic_partitions(RUNS_PARTITIONS_NAME) == ["tiny-run"]
        assert typo.get_asset_check_evaluations() == [] and typo.get_asset_materialization_events() == []
        again = job.execute_in_process(partition_key="tiny-run", instance=instance, raise_on_error=False)
        assert again.success and all(e.passed for e in again.get_asset_check_evaluations())


def test_demo_main_prints_headlines(
    tmp_path: Path, tiny_logs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "dagster_home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    rc = demo_main(["--logs-root", str(tiny_logs), "--warehouse", str(tmp_path / "wh"), "--ingest-only"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "ingested 2 run(s)" in out and ", of which fits 0.0s; cross-run job " in out  # --ingest-only: no fit job
    assert "tiny-run: ok  files=1 steps=3 samples=0" in out
    assert "asset checks: 59/60 passed" in out and "failed: bad-run rejects:reject_share (WARN)" in out
    assert "runs=2  source files=2  steps=5" in out
    assert f"warehouse: {tmp_path / 'wh'}" in out and "took " in out
    # the persistent instance under DAGSTER_HOME keeps the runs for the UI
    with DagsterInstance.from_config(str(home)) as instance:
        assert sorted(instance.get_dynamic_partitions(RUNS_PARTITIONS_NAME)) == ["bad-run", "tiny-run"]
        assert len(instance.get_runs()) == 3  # a run per partition + the cross-run job


@pytest.mark.slow
def test_demo_corpus_through_dagster_matches_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo corpus (sample_logs/) through every asset, as `make demo` runs it: lands exactly the
    rows the library ingest writes on its own, with no ERROR check failing."""
    monkeypatch.setenv("POLYTRACE_PNG", "0")  # the characterize stage's switch: no Chromium for PNGs
    runs = runs_by_id(SAMPLE_LOGS)
    assert runs, f"no run directories under {SAMPLE_LOGS}"
    defs, root = _defs(tmp_path, SAMPLE_LOGS)
    with DagsterInstance.ephemeral() as instance:
        result = materialize_all(defs, instance, SAMPLE_LOGS)
    assert result.success
    assert result.cross_run is not None
    cross = {e.asset_key for e in result.cross_run.get_asset_materialization_events()}
    assert cross == set(defs.resolve_job_def("cross_run_job").asset_layer.selected_asset_keys)
    # each run was fitted in its own fit job after its ingest; the cross-run fit only combined them
    assert sorted(result.per_run_fit) == sorted(runs)
    fitted = {r: _mat(p, "run_workload").metadata for r, p in result.per_run_fit.items()}
    # every run with lengths has a workload: the per-sample ones from their samples, the verl console,
    # file-logger and agentic runs from their per-step summaries, with the fitted quantiles beside the logged ones
    assert {r for r, m in fitted.items() if "spec" in m} == set(runs)
    by_source = {r: m["fitted_from"].value for r, m in fitted.items()}
    assert {r for r, v in by_source.items() if v == "fitted from samples"} == {"polytrace-math-dapo",
                                                                              "polytrace-search-multiturn"}
    assert all("summary_check" in fitted[r] for r, v in by_source.items() if v == "fitted from summaries")
    assert all(m["computed"].value for r, m in fitted.items() if "spec" in m)
    specs = _mat(result.cross_run, "workload_specs").metadata
    assert specs["runs_fitted"].value == len(runs) and specs["runs_computed"].value == 0
    assert result.run_ids == sorted(runs)
    errors = [f for f in result.checks.failed if not f.endswith("(WARN)")]
    assert errors == []
    n_checks = _per_run_checks(defs)
    assert all(len(r.get_asset_check_evaluations()) == n_checks for r in result.per_run.values())

    lib_root = tmp_path / "lib"
    for rid, plan in runs.items():
        ingest_run(plan.path, lib_root, run_id=rid, only=plan.only)
    for rid in runs:
        assert run_row_counts(root, rid) == run_row_counts(lib_root, rid), rid
        # materialization metadata agrees with the tables
        mats = {
            e.asset_key.to_user_string(): e.materialization
            for e in result.per_run[rid].get_asset_materialization_events()
        }
        assert {t: mats[t].metadata["partition_row_count"].value for t in TABLES} == run_row_counts(root, rid)
        # dagster/row_count, shown beside the partition, is the partition's rows (it was the whole table's)
        assert {t: mats[t].metadata["dagster/row_count"].value for t in TABLES} == run_row_counts(root, rid)
    # the table's rows over every run are beside it (as of the last run's ingest)
    last = result.per_run[max(result.per_run)]
    total = {e.asset_key.to_user_string(): e.materialization.metadata["table_row_count"].value
             for e in last.get_asset_materialization_events() if e.asset_key.to_user_string() in TABLES}
    assert total == {t: table_rows(root, t) for t in TABLES}
    a = scan_table(root, "steps").sort("run_id", "step").collect()
    b = scan_table(lib_root, "steps").sort("run_id", "step").collect()
    assert a.height > 0 and a.equals(b)
