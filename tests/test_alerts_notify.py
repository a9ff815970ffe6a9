"""Alerts that reach a person (issue 26, items 3-4): each health alert is sent once through Apprise
to a real HTTP endpoint on 127.0.0.1, never for a healthy run, a down endpoint is one line; the
alert kinds are asset checks of the run's partition with their severity."""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pytest
from _notify_util import Receiver
from _views_util import stage_run
from _warehouse_util import free_port

from analyses.alerts import Alert, alerts_from_frame, deliver, notify_urls, state_path
from analyses.api import PolyTrace
from analyses.cli import main
from analyses.views.training_health import ALERT_RULES


def _metrics(series: dict[str, list[float]]) -> pl.DataFrame:
    rows = [{"step": i + 1, "metric": m, "value": v, "raw_metric": m, "is_validation": False}
            for m, vals in series.items() for i, v in enumerate(vals)]
    return pl.DataFrame(rows)


def _collapsing(root: Path, run_id: str = "collapse") -> None:
    """Response length at 1000 for 10 steps, then 1 token: a response-length collapse from step 11;
    entropy falls too, from step 13."""
    stage_run(root, run_id, {"step_metrics": _metrics({
        "response_length/mean": [1000.0] * 10 + [1.0] * 10,
        "actor/entropy": [0.5] * 12 + [0.001] * 8,
    })})


def _healthy(root: Path, run_id: str = "healthy") -> None:
    stage_run(root, run_id, {"step_metrics": _metrics({"response_length/mean": [1000.0 + 10 * i for i in range(20)],
                                                       "actor/entropy": [0.5] * 20})})


def test_notify_urls_split_on_spaces_and_commas() -> None:
    assert notify_urls(" json://a:1/ ,slack://T/B/C  mailto://u:p@x ") == ["json://a:1/", "slack://T/B/C", "mailto://u:p@x"]
    assert notify_urls("") == []


def test_every_rule_has_a_severity_and_collapses_are_errors() -> None:
    sev = {r.kind: r.severity for r in ALERT_RULES}
    assert {k for k, s in sev.items() if s == "error"} == {"response_length_collapse", "reward_collapse", "entropy_collapse"}
    assert {k for k, s in sev.items() if s == "warn"} == {"clip_ratio_high", "throughput_drop"}


def test_one_message_per_alert_and_none_for_a_healthy_run(tmp_path: Path, receiver: Receiver) -> None:
    root = tmp_path / "wh"
    _collapsing(root)
    _healthy(root)
    pt = PolyTrace(root)
    alerts = pt.alerts()
    assert [(a.run_id, a.kind, a.first_step, a.severity) for a in alerts] == [
        ("collapse", "response_length_collapse", 11, "error"), ("collapse", "entropy_collapse", 13, "error")]
    done = pt.notify(alerts, [receiver.url])
    assert len(done.sent) == 2 and not done.failed
    assert len(receiver.messages) == 2
    first = receiver.messages[0]
    # the message names the run, the kind, the first step and the numbers behind it
    assert "collapse" in first["title"] and "response_length_collapse" in first["title"] and "step 11" in first["title"]
    assert "fell to 1 at step 11" in first["message"] and "1000" in first["message"]
    assert first["type"] == "failure"
    # a refresh (the same alerts again) sends nothing more
    again = pt.notify(pt.alerts(), [receiver.url])
    assert again.sent == [] and again.already == 2 and len(receiver.messages) == 2
    # the healthy run raises nothing, so nothing is sent for it
    assert pt.alerts(["healthy"]) == []


def test_endpoint_down_is_one_line_and_retried_later(tmp_path: Path, receiver: Receiver) -> None:
    root = tmp_path / "wh"
    _collapsing(root)
    pt = PolyTrace(root)
    down = f"json://127.0.0.1:{free_port()}/"
    done = pt.notify(pt.alerts(), [down])
    assert done.sent == [] and len(done.failed) == 2
    line = done.lines()[0]
    assert "\n" not in line and line.startswith("notification failed: response_length_collapse in run collapse")
    assert "connection" in line.lower()
    # not remembered as sent: the endpoint back up gets both
    assert len(pt.notify(pt.alerts(), [receiver.url]).sent) == 2 and len(receiver.messages) == 2


def test_concurrent_deliveries_send_each_alert_once(tmp_path: Path, receiver: Receiver) -> None:
    root = tmp_path / "wh"
    _collapsing(root)
    alerts = PolyTrace(root).alerts()
    threads = [threading.Thread(target=deliver, args=(alerts, [receiver.url], state_path(root))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(receiver.messages) == 2


def test_cli_alerts_and_notify(tmp_path: Path, receiver: Receiver, capsys: pytest.CaptureFixture,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "wh"
    _collapsing(root)
    assert main(["alerts", "--warehouse", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "ALERT ERROR collapse response_length_collapse step 11 value 1 (was 1000)"
    assert all(len(ln) <= 160 for ln in out)
    monkeypatch.delenv("POLYTRACE_NOTIFY", raising=False)
    assert main(["alerts", "--notify", "--warehouse", str(root)]) == 2
    assert "POLYTRACE_NOTIFY" in capsys.readouterr().err
    monkeypatch.setenv("POLYTRACE_NOTIFY", receiver.url)
    assert main(["alerts", "--notify", "--warehouse", str(root)]) == 0
    assert len(receiver.messages) == 2
    assert capsys.readouterr().err.count("notified: PolyTrace ERROR") == 2
    assert main(["alerts", "--notify", "--warehouse", str(root)]) == 0
    assert len(receiver.messages) == 2 and capsys.readouterr().err == ""
    monkeypatch.setenv("POLYTRACE_NOTIFY", "not a url at all")
    assert main(["alerts", "--notify", "--warehouse", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an Apprise URL" in err[0]


def test_alerts_from_frame_orders_by_run_and_step() -> None:
    cols = {"run_id": ["b", "a"], "kind": ["k1", "k2"], "severity": ["warn", "error"], "metric": ["m", "m"],
            "first_step": [3, 7], "last_step": [9, 9], "n_steps": [7, 3], "first_value": [0.5, None],
            "earlier_level": [None, 2.0], "threshold": [0.1, 0.5], "detail": ["x", "y"]}
    got = alerts_from_frame(pl.DataFrame(cols))
    assert [a.run_id for a in got] == ["a", "b"] and isinstance(got[0], Alert)
    assert got[0].key == "a|k2|7"


def _console_log(path: Path, lengths: list[float], entropy: list[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"step:{i + 1} - response_length/mean:{x} - actor/entropy:{e} - timing_s/step:10.0\n"
                            for i, (x, e) in enumerate(zip(lengths, entropy, strict=True))))


def test_alert_checks_red_with_detail_in_the_per_run_job(tmp_path: Path) -> None:
    """The per-run job evaluates one check per alert kind on the run's partition: ERROR and failed
    for the collapse, with its first step, value and earlier level; every check passes on a
    healthy run."""
    from dagster import AssetCheckSeverity, DagsterInstance

    from pipelines import alerts as pa
    from pipelines.definitions import build_defs
    from pipelines.resources import WarehouseResource
    from pipelines.sensors import INGEST_JOB_NAME

    logs = tmp_path / "logs"
    _console_log(logs / "collapse" / "train.log", [1000.0] * 10 + [1.0] * 10, [0.5] * 20)
    _console_log(logs / "healthy" / "train.log", [1000.0 + i for i in range(20)], [0.5] * 20)
    res_def = WarehouseResource(root=str(tmp_path / "wh"), logs_root=str(logs))
    job = build_defs(warehouse=res_def).resolve_job_def(INGEST_JOB_NAME)
    got = {}
    with DagsterInstance.ephemeral() as inst:
        inst.add_dynamic_partitions("runs", ["collapse", "healthy"])
        for part in ("collapse", "healthy"):
            r = job.execute_in_process(instance=inst, partition_key=part)
            got |= {(part, ev.check_name): ev for ev in r.get_asset_check_evaluations()
                    if ev.check_name.startswith("alert_")}
    bad = got[("collapse", pa.check_name("response_length_collapse"))]
    assert not bad.passed and bad.severity == AssetCheckSeverity.ERROR
    assert bad.metadata["first_step"].value == 11 and bad.metadata["earlier_level"].value == 1000.0
    assert bad.metadata["value_at_first_step"].value == 1.0
    assert got[("collapse", pa.check_name("clip_ratio_high"))].passed
    assert got[("collapse", pa.check_name("throughput_drop"))].severity == AssetCheckSeverity.WARN
    healthy = [ev for (part, _), ev in got.items() if part == "healthy"]
    assert len(healthy) == len(ALERT_RULES) and all(ev.passed for ev in healthy)


@pytest.mark.slow
def test_notification_sensor_sends_a_partitions_new_alerts_once(tmp_path: Path, receiver: Receiver,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The sensor follows `steps` materializations: each tick sends the new alerts of the partitions
    materialized since its cursor, once; nothing for a healthy partition; a skip (no crash) without
    $POLYTRACE_NOTIFY, or with nothing new; two partitions materialized between two ticks are both
    read (a plain asset sensor would see only the latest)."""
    from dagster import DagsterInstance, SensorResult, build_sensor_context

    from pipelines import alerts as pa
    from pipelines.definitions import build_defs
    from pipelines.resources import WarehouseResource
    from pipelines.sensors import INGEST_JOB_NAME

    logs = tmp_path / "logs"
    _console_log(logs / "collapse" / "train.log", [1000.0] * 10 + [1.0] * 10, [0.5] * 20)
    _console_log(logs / "healthy" / "train.log", [1000.0 + i for i in range(20)], [0.5] * 20)
    _console_log(logs / "falls" / "train.log", [800.0] * 12 + [2.0] * 8, [0.5] * 20)
    res_def = WarehouseResource(root=str(tmp_path / "wh"), logs_root=str(logs))
    job = build_defs(warehouse=res_def).resolve_job_def(INGEST_JOB_NAME)
    with DagsterInstance.ephemeral() as inst:
        inst.add_dynamic_partitions("runs", ["collapse", "healthy", "falls"])
        cursor: list[str | None] = [None]

        def tick(*parts: str) -> SensorResult:
            for part in parts:
                job.execute_in_process(instance=inst, partition_key=part)
            res = pa.health_alert_notifications(
                build_sensor_context(instance=inst, cursor=cursor[0], resources={"warehouse": res_def}))
            assert isinstance(res, SensorResult)
            cursor[0] = res.cursor
            return res

        monkeypatch.delenv("POLYTRACE_NOTIFY", raising=False)
        assert "POLYTRACE_NOTIFY" in str(tick("collapse").skip_reason) and receiver.messages == []
        monkeypatch.setenv("POLYTRACE_NOTIFY", receiver.url)
        assert "no new alert" in str(tick("healthy").skip_reason) and receiver.messages == []
        assert tick("collapse").skip_reason is None and len(receiver.messages) == 1
        assert "response_length_collapse" in receiver.messages[0]["title"]
        assert receiver.messages[0]["message"].startswith("Run collapse:")
        assert "no new alert" in str(tick("collapse").skip_reason) and len(receiver.messages) == 1
        assert "since the last tick" in str(tick().skip_reason) and len(receiver.messages) == 1
        tick("healthy", "falls")
        assert len(receiver.messages) == 2 and receiver.messages[1]["message"].startswith("Run falls:")
