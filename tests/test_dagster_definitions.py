"""The Dagster code location loads as `dagster dev -m pipelines.definitions` loads it, with the
asset and check keys committed below; the logs-root sensor adds partitions and requests runs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    Definitions,
    SensorResult,
    __version__,
    build_sensor_context,
    instance_for_test,
)

from analyses.manifest import ManifestError
from analyses.run_split import plan_runs
from pipelines.definitions import CROSS_RUN_JOB_NAME, build_defs, defs
from pipelines.partitions import (
    FINGERPRINT_META,
    RUNS_PARTITIONS_NAME,
    dir_fingerprint,
    run_fingerprint,
    runs_by_id,
    scan_runs,
)
from pipelines.resources import WarehouseResource
from pipelines.sensors import FIT_RUN_JOB_NAME, INGEST_JOB_NAME, RunDirState, plan_tick, run_dirs_sensor

# The committed snapshot. A stage that adds assets or checks updates these lists on purpose.
# the characterize stage (pipelines/assets/characterize.py): one asset per view group and the report
REPO = Path(__file__).resolve().parents[1]

CHARACTERIZE_KEYS = [
    "characterization_report",
    "filter_waste_view",
    "gpu_utilization_view",
    "lengths_view",
    "multiturn_view",
    "profiler_trace_view",
    "rank_imbalance_view",
    "run_comparison",
    "stage_breakdown_view",
    "step_variance_view",
    "tool_latency_view",
    "training_health_view",
]
# the fit and export stages (pipelines/assets/fit.py, export.py): specs + fidelity, every export format
FIT_KEYS = ["workload_exports", "workload_specs"]
# one run's fit, its own job after the run's ingest (cached by content: the cross-run fit only combines)
PER_RUN_FIT_KEYS = ["run_workload"]
EXPECTED_ASSET_KEYS = sorted(
    [
        "filter_batches",
        "gpu_samples",
        "rank_times",
        "rejects",
        "run_config",
        "runs",
        "samples",
        "source_files",
        "step_metrics",
        "step_windows",
        "steps",
        "tool_calls",
        "trace_kernels",
        "trace_ops",
        "trace_ranks",
        "turns",
        "warehouse_catalog",
        *CHARACTERIZE_KEYS,
        *FIT_KEYS,
        *PER_RUN_FIT_KEYS,
    ]
)
EXPECTED_CHECK_KEYS = [
    "filter_batches:schema_matches_contract",
    "gpu_samples:schema_matches_contract",
    "rank_times:non_negative_times",
    "rank_times:schema_matches_contract",
    "rejects:reject_share",
    "rejects:schema_matches_contract",
    "run_config:schema_matches_contract",
    "runs:schema_matches_contract",
    "samples:schema_matches_contract",
    "source_files:lines_accounted",
    "source_files:schema_matches_contract",
    "step_metrics:repeated_steps",
    "step_metrics:schema_matches_contract",
    "step_windows:schema_matches_contract",
    "steps:alert_clip_ratio_high",
    "steps:alert_entropy_collapse",
    "steps:alert_response_length_collapse",
    "steps:alert_reward_collapse",
    "steps:alert_throughput_drop",
    "steps:non_negative_times",
    "steps:run_has_data",
    "steps:schema_matches_contract",
    "steps:unique_ordered_steps",
    "tool_calls:non_negative_times",
    "tool_calls:schema_matches_contract",
    "trace_kernels:schema_matches_contract",
    "trace_ops:schema_matches_contract",
    "trace_ranks:schema_matches_contract",
    "turns:non_negative_times",
    "turns:schema_matches_contract",
]
BLOCKING_CHECKS = {k for k in EXPECTED_CHECK_KEYS if k.endswith(":schema_matches_contract")} | {
    "steps:unique_ordered_steps", "steps:run_has_data"
}
TABLE_KEYS = [
    k
    for k in EXPECTED_ASSET_KEYS
    if k != "warehouse_catalog" and k not in CHARACTERIZE_KEYS and k not in FIT_KEYS and k not in PER_RUN_FIT_KEYS
]


def test_code_location_loads_like_dagster_dev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Load through Dagster's workspace machinery (what `dagster dev -m` and `dagster definitions
    validate` use), then read the keys from the repository snapshot the UI is served from."""
    from dagster._cli.workspace.cli_target import get_workspace_from_cli_opts
    from dagster_shared.cli import WorkspaceOpts

    monkeypatch.setenv("POLYTRACE_WAREHOUSE", str(tmp_path / "wh"))
    opts = WorkspaceOpts(workspace=(str(REPO / "workspace.yaml"),))
    with (
        instance_for_test() as instance,
        get_workspace_from_cli_opts(
            instance, __version__, opts, allow_in_process=True, log_level="warning"
        ) as ws,
    ):
        entries = ws.get_code_location_entries()
        assert list(entries) == ["polytrace"]  # the location's name in the UI
        entry = entries["polytrace"]
        assert entry.load_error is None, entry.load_error
        (repo,) = entry.code_location.get_repositories().values()
        assert (
            sorted(n.asset_key.to_user_string() for n in repo.get_asset_node_snaps()) == EXPECTED_ASSET_KEYS
        )
        checks = sorted(f"{c.asset_key.to_user_string()}:{c.name}" for c in repo.get_asset_check_node_snaps())
        assert checks == EXPECTED_CHECK_KEYS
        assert sorted(s.name for s in repo.get_sensors()) == ["cross_run_automation", "health_alert_notifications", "run_dirs_sensor"]
        assert {INGEST_JOB_NAME, FIT_RUN_JOB_NAME, CROSS_RUN_JOB_NAME} <= {j.name for j in repo.get_all_jobs()}
        ws.asset_graph.validate_partitions()


def test_definitions_validate_and_snapshot() -> None:
    Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    assert sorted(k.to_user_string() for k in graph.get_all_asset_keys()) == EXPECTED_ASSET_KEYS
    checks = {f"{k.asset_key.to_user_string()}:{k.name}": k for k in graph.asset_check_keys}
    assert sorted(checks) == EXPECTED_CHECK_KEYS
    blocking = {name for name, key in checks.items() if graph.get_check_spec(key).blocking}
    assert blocking == BLOCKING_CHECKS


def test_groups_partitions_and_jobs() -> None:
    graph = defs.resolve_asset_graph()
    for k in TABLE_KEYS:
        node = graph.get(AssetKey(k))
        assert node.group_name == "ingest", k
        assert node.partitions_def is not None and node.partitions_def.name == RUNS_PARTITIONS_NAME
    catalog = graph.get(AssetKey("warehouse_catalog"))
    assert catalog.group_name == "warehouse" and catalog.partitions_def is None
    assert {p.to_user_string() for p in catalog.parent_keys} == set(TABLE_KEYS)

    ingest_job = defs.resolve_job_def(INGEST_JOB_NAME)
    assert ingest_job.partitions_def is not None and ingest_job.partitions_def.name == RUNS_PARTITIONS_NAME
    assert sorted(k.to_user_string() for k in ingest_job.asset_layer.selected_asset_keys) == sorted(
        [*TABLE_KEYS, "warehouse_catalog"]
    )
    fit_job = defs.resolve_job_def(FIT_RUN_JOB_NAME)
    assert fit_job.partitions_def is not None and fit_job.partitions_def.name == RUNS_PARTITIONS_NAME
    assert sorted(k.to_user_string() for k in fit_job.asset_layer.selected_asset_keys) == PER_RUN_FIT_KEYS
    fit = graph.get(AssetKey("run_workload"))
    assert fit.group_name == "fit" and fit.partitions_def is not None and fit.partitions_def.name == RUNS_PARTITIONS_NAME
    assert fit.automation_condition is not None  # cross_run_automation starts the fit after an ingest
    assert "run_workload" in {p.to_user_string() for p in graph.get(AssetKey("workload_specs")).parent_keys}
    cross = defs.resolve_job_def(CROSS_RUN_JOB_NAME)
    assert sorted(k.to_user_string() for k in cross.asset_layer.selected_asset_keys) == sorted(
        ["warehouse_catalog", *CHARACTERIZE_KEYS, *FIT_KEYS]
    )


def test_resource_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYTRACE_WAREHOUSE", str(tmp_path / "wh"))
    monkeypatch.setenv("POLYTRACE_LOGS_ROOT", str(tmp_path / "logs"))
    wh = WarehouseResource.from_env()
    assert wh.root == str(tmp_path / "wh") and wh.logs_root == str(tmp_path / "logs")
    monkeypatch.delenv("POLYTRACE_WAREHOUSE")
    monkeypatch.delenv("POLYTRACE_LOGS_ROOT")
    monkeypatch.chdir(tmp_path)
    wh = WarehouseResource.from_env()  # defaults, made absolute against the working directory
    assert wh.root == str(tmp_path / "warehouse") and wh.logs_root == str(tmp_path / "sample_logs")


# --- sensor ------------------------------------------------------------------------------------

OLD = time.time() - 3600  # an mtime old enough to count as settled


def _run_dir(
    root: Path,
    name: str,
    text: str = "step:1 - timing_s/step:2.0\n",
    mtime: float = OLD,
    manifest: str | None = None,
) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.log").write_text(text)
    if manifest is not None:
        (d / "run.toml").write_text(manifest)
    for p in (*d.iterdir(), d):
        os.utime(p, (mtime, mtime))
    return d


def _tick(instance: DagsterInstance, logs: Path, cursor: str | None = None) -> SensorResult:
    wh = WarehouseResource(root=str(logs.parent / "wh"), logs_root=str(logs))
    ctx = build_sensor_context(instance=instance, cursor=cursor, resources={"warehouse": wh})
    res = run_dirs_sensor(ctx)
    assert isinstance(res, SensorResult)
    return res


def _apply(instance: DagsterInstance, res: SensorResult) -> None:
    for req in res.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys or []))


def test_sensor_adds_partitions_and_requests_new_and_changed(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    _run_dir(logs, "run-a")
    _run_dir(logs, "run b", manifest='run_id = "custom-id"\n')  # the manifest's id is the key
    _run_dir(logs, ".hidden")
    (logs / "loose-file.log").write_text("not a run directory\n")
    with DagsterInstance.ephemeral() as instance:
        res = _tick(instance, logs)
        (add,) = res.dynamic_partitions_requests
        assert add.partitions_def_name == RUNS_PARTITIONS_NAME and list(add.partition_keys) == [
            "custom-id",
            "run-a",
        ]
        assert sorted(r.partition_key for r in res.run_requests) == ["custom-id", "run-a"]
        assert all(r.run_key and r.run_key.startswith(r.partition_key + "@") for r in res.run_requests)
        cursor = json.loads(res.cursor)
        assert cursor["run-a"] == dir_fingerprint(logs / "run-a").key
        _apply(instance, res)

        # nothing changed: no partition, no run, same cursor
        res2 = _tick(instance, logs, res.cursor)
        assert not res2.run_requests and not res2.dynamic_partitions_requests and res2.skip_reason
        assert json.loads(res2.cursor) == cursor

        # run-a grows and a new run appears, both still being written (mtime now): both are ingested
        # at once, no quiet wait (the next tick's ingest reads only what was appended meanwhile)
        _run_dir(logs, "run-a", text="step:1 - timing_s/step:2.0\nstep:2 - timing_s/step:3.0\n", mtime=time.time())
        _run_dir(logs, "run-c", mtime=time.time())
        res3 = _tick(instance, logs, res2.cursor)
        assert sorted(r.partition_key for r in res3.run_requests) == ["run-a", "run-c"]
        assert [list(r.partition_keys) for r in res3.dynamic_partitions_requests] == [["run-c"]]
        assert "run-c" in json.loads(res3.cursor)


def test_sensor_without_cursor_skips_runs_ingested_unchanged(tmp_path: Path) -> None:
    """A fresh cursor (new UI instance, reset sensor) re-ingests only runs whose directory no longer
    matches the fingerprint recorded by their last ingest."""
    logs = tmp_path / "logs"
    _run_dir(logs, "same")
    _run_dir(logs, "edited")
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(RUNS_PARTITIONS_NAME, ["same", "edited"])
        for name, fp in (("same", dir_fingerprint(logs / "same").key), ("edited", "0f-0b-0")):
            instance.report_runless_asset_event(
                AssetMaterialization(asset_key="runs", partition=name, metadata={FINGERPRINT_META: fp})
            )
        res = _tick(instance, logs)
        assert [r.partition_key for r in res.run_requests] == ["edited"]
        assert not res.dynamic_partitions_requests
        assert set(json.loads(res.cursor)) == {"same", "edited"}


def test_plan_tick_follows_growing_runs_one_ingest_at_a_time() -> None:
    """A changed run is requested at once, even written a second ago; not while an ingest of it is
    queued or running (the cursor keeps the old fingerprint: the next tick asks again)."""
    now = time.time()
    st = {"live": RunDirState("live", "/x/live", "2f", now - 1), "new": RunDirState("new", "/x/new", "1f", now - 1),
          "held": RunDirState("held", "/x/held", "3f", now - 1)}
    plan = plan_tick(st, {"live": "1f", "held": "2f"}, {"live", "held"}, busy=lambda rid: rid == "held")
    assert sorted(r.run_id for r in plan.requests) == ["live", "new"]
    assert plan.cursor == {"live": "2f", "held": "2f", "new": "1f"}
    assert plan.busy == ["held"] and plan.new_partitions == ["new"]
    later = plan_tick(st, plan.cursor, {"live", "held", "new"})
    assert [r.run_id for r in later.requests] == ["held"]


def test_plan_tick_drops_vanished_and_invalid_keys() -> None:
    st = {
        "a": RunDirState("a", "/x/a", "1f-1b-1", 1.0),
        "b...c": RunDirState("b...c", "/x/b...c", "1f-1b-1", 1.0),  # '...' is refused by Dagster
    }
    plan = plan_tick(st, {"a": "1f-1b-1", "gone": "2f-2b-2"}, {"a"})
    assert plan.cursor == {"a": "1f-1b-1"} and plan.invalid == ["b...c"] and not plan.requests
    assert not plan.new_partitions


def test_a_directory_of_several_logs_is_one_partition_per_log(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    d = _run_dir(logs, "my run (v2)")  # one log: the directory is the run, its name made a run id
    assert [(rid, p.only) for rid, p in runs_by_id(logs).items()] == [("my_run_v2", None)]
    (d / "other.log").write_text("step:0 - timing_s/step:2.0\n")  # a second log that starts over
    runs = runs_by_id(logs)
    assert sorted(runs) == ["my_run_v2.other", "my_run_v2.train"]  # <directory>.<log>: unique across directories
    assert {rid: sorted(f.name for f in p.only or ()) for rid, p in runs.items()} == {
        "my_run_v2.other": ["other.log"], "my_run_v2.train": ["train.log"]}
    # each has its own fingerprint: editing one log requests only its run
    before = {rid: run_fingerprint(p).key for rid, p in runs.items()}
    (d / "other.log").write_text("step:0 - timing_s/step:2.0\nstep:1 - timing_s/step:2.0\n")
    after = {rid: run_fingerprint(p).key for rid, p in runs_by_id(logs).items()}
    assert after["my_run_v2.train"] == before["my_run_v2.train"] and after["my_run_v2.other"] != before["my_run_v2.other"]
    with pytest.raises(ManifestError):  # a broken manifest is the directory's problem, said once
        plan_runs(_run_dir(tmp_path, "broken", manifest="task = \n"))


# Each of these directories is unusable in its own way; none may cost the others their tick.
MALFORMED = {
    "___": None,  # no character usable as a run id
    "x!": None,  # becomes 'x', which a good run below already is
    "bad-id": 'run_id = "///"\n',
    "int-id": "run_id = 5\n",
    "dots-id": 'run_id = "a..b"\n',
    "long-id": f'run_id = "{"x" * 300}"\n',
    "huge-time": "started_at = 1e300\n",
    "word-time": 'started_at = "yesterday"\n',
    "tags-str": 'tags = "x"\n',
    "gpus-str": 'n_gpus = "eight"\n',
    "bad-toml": "task = \n",
    "utf16-toml": None,
    "toml-dir": None,
    "tok-out": 'tokenizer = "../../etc/passwd"\n',
    "dup-a": 'run_id = "dup"\n',
    "dup-b": 'run_id = "dup"\n',
}


def test_malformed_run_dirs_are_warnings_and_the_good_runs_still_run(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    for good in ("x", "good-run"):
        _run_dir(logs, good)
    for name, manifest in MALFORMED.items():
        _run_dir(logs, name, manifest=manifest)
    (logs / "utf16-toml" / "run.toml").write_bytes("task = 'x'\n".encode("utf-16"))
    (logs / "toml-dir" / "run.toml").mkdir()
    dirs, problems = scan_runs(logs)
    assert sorted(dirs) == ["dup", "good-run", "x"]  # the first of two directories claiming 'dup' keeps it
    assert set(problems) == set(MALFORMED) - {"dup-a"}
    assert "already 'dup-a'" in problems["dup-b"] and "started_at" in problems["huge-time"]
    with DagsterInstance.ephemeral() as instance:
        res = _tick(instance, logs)
    assert sorted(r.partition_key for r in res.run_requests) == ["dup", "good-run", "x"]


def test_build_defs_binds_the_given_warehouse(tmp_path: Path) -> None:
    wh = WarehouseResource(root=str(tmp_path / "wh"), logs_root=str(tmp_path / "logs"))
    d = build_defs(wh)
    assert d.resources["warehouse"] is wh
