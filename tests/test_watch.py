"""``polytrace watch`` (issue 26, item 5): follows a run while it is written, one line per batch of
new steps and per new alert, each alert notified once, a clean stop on Ctrl-C and SIGTERM; and the
latency from a step line written to its alert received by a local HTTP endpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _notify_util import Receiver, notified_once, write_steps_at_pace

from analyses.api import PolyTrace
from analyses.warehouse import published_runs
from analyses.watch import LINE_WIDTH, Watcher, step_line, watch

I80 = "verl_agentic_open-agentrl/run-20251129_221801-i80f2v90/files/output.log"
# the i80 run's alerts (tests/test_views_health.py): kind -> first step, and the steps a rule needs
I80_ALERTS = {"response_length_collapse": 11, "entropy_collapse": 16}
SUSTAIN = 5
LATENCY_TARGET_S = 15.0


def _console(lengths: list[float]) -> str:
    return "".join(f"step:{i + 1} - response_length/mean:{x} - actor/entropy:0.5 - timing_s/step:10.0\n"
                   for i, x in enumerate(lengths))


def test_step_line_fits_80_columns() -> None:
    line = step_line(41, 48, {"response_length_mean": 812.4, "reward_mean": 0.4123, "entropy": 0.21,
                              "clip_ratio": 0.031}, 37.25)
    assert line == "steps 41-48: len=812 reward=0.412 entropy=0.21 clip=3.1% 37.2 s/step"
    long = step_line(99991, 99998, {"response_length_mean": 1114.2, "reward_mean": -0.8833, "entropy": 0.2191,
                                    "clip_ratio": 0.004991}, 273.94)
    assert long == "steps 99991-99998: len=1,114 reward=-0.883 entropy=0.219 clip=0.499% 274 s/step"
    assert len(long) <= LINE_WIDTH
    assert step_line(7, 7, {}, None) == "step 7: no health metrics"


def test_watcher_reports_new_steps_and_each_alert_once(tmp_path: Path, receiver: Receiver) -> None:
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text(_console([1000.0] * 8))
    w = Watcher(PolyTrace(tmp_path / "wh"), log.parent, urls=[receiver.url])
    first = w.poll()
    assert first.ingested and first.lines == ["steps 1-8: len=1,000 entropy=0.5 10 s/step"]
    assert not w.poll().ingested  # nothing changed: no ingest, nothing said
    with log.open("a") as fh:
        fh.write(_console([1000.0] * 10 + [1.0] * 6)[len(_console([1000.0] * 8)):])
    second = w.poll()  # steps 9-16: (2 x 1000 + 6 x 1) / 8 = 250.75
    assert second.lines[0] == "steps 9-16: len=251 entropy=0.5 10 s/step"
    assert [a.kind for a in second.new_alerts] == ["response_length_collapse"]
    assert second.lines[1].startswith("ALERT ERROR run response_length_collapse step 11 value 1 (was 1")
    assert len(receiver.messages) == 1
    with log.open("a") as fh:
        fh.write("step:17 - response_length/mean:1.0 - actor/entropy:0.5 - timing_s/step:10.0\n")
    third = w.poll()
    assert third.lines == ["step 17: len=1 entropy=0.5 10 s/step"] and third.new_alerts == []
    assert len(receiver.messages) == 1  # the same alert, one more step: not sent again
    assert w.summary() == "watch run: stopped after 3 refresh(es); steps 1-17; 1 alert(s), 1 notified"


def test_ctrl_c_between_the_step_line_and_its_alert_leaves_a_summary_that_matches_the_output(
        tmp_path: Path) -> None:
    """The stop-33 race: a signal arriving after a poll had counted its steps but before their line
    was printed left a summary naming a step no line showed. Now a step or an alert counts as
    reported only once its line is said."""
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text(_console([1000.0] * 10 + [1.0] * 6))
    w = Watcher(PolyTrace(tmp_path / "wh"), log.parent)
    said: list[str] = []

    def interrupted_at_the_alert(line: str) -> None:
        if line.startswith("ALERT "):
            raise KeyboardInterrupt
        said.append(line)

    with pytest.raises(KeyboardInterrupt):
        w.poll(interrupted_at_the_alert)
    assert said == ["steps 1-16: len=625 entropy=0.5 10 s/step"]  # (10 x 1000 + 6 x 1) / 16 = 625.4
    assert w.summary() == "watch run: stopped after 1 refresh(es); steps 1-16; 0 alert(s)"

    def interrupted_at_the_steps(line: str) -> None:
        raise KeyboardInterrupt

    w2 = Watcher(PolyTrace(tmp_path / "wh2"), log.parent)
    with pytest.raises(KeyboardInterrupt):
        w2.poll(interrupted_at_the_steps)
    assert w2.summary() == "watch run: stopped after 1 refresh(es); no steps; 0 alert(s)"


def test_a_signal_during_a_held_line_waits_until_the_line_is_counted() -> None:
    from analyses.cli.watch import _SignalGate, _Stopped

    stopping = threading.Event()
    gate = _SignalGate(stopping)
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        with gate.hold():
            gate.on_signal(signal.SIGINT, None)  # as if Ctrl-C arrived right after the print
            done.append("counted")
    assert done == ["counted"] and stopping.is_set()
    with pytest.raises(_Stopped):
        gate.on_signal(signal.SIGTERM, None)  # outside hold(): at once


def test_watch_loop_stops_when_told(tmp_path: Path) -> None:
    log = tmp_path / "one.log"
    log.write_text(_console([100.0] * 3))
    said: list[str] = []
    stop = threading.Event()
    w = Watcher(PolyTrace(tmp_path / "wh"), log)
    t = threading.Thread(target=watch, args=(w, 0.05, stop, said.append))
    t.start()
    deadline = time.monotonic() + 60
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join(10)
    assert not t.is_alive() and said == ["steps 1-3: len=100 entropy=0.5 10 s/step"]


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "analyses.cli", "watch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=Path(__file__).resolve().parents[1])


def _env(url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "POLYTRACE_NOTIFY"}
    if url:
        env["POLYTRACE_NOTIFY"] = url
    return env


@pytest.mark.real_logs
@pytest.mark.slow
def test_watch_follows_the_collapsing_agentic_run_and_notifies_each_alert_once(
        tmp_path: Path, receiver: Receiver, real_file) -> None:  # noqa: ANN001
    """The i80 run's output.log written line by line at a steady pace (a step every ~0.5 s) into a
    run directory that `polytrace watch` follows: step lines appear, each alert reaches the HTTP
    endpoint once, within LATENCY_TARGET_S of the step line that completes it; Ctrl-C stops it."""
    lines = real_file(I80).read_text().splitlines(keepends=True)
    end = next(i for i, ln in enumerate(lines) if ln.startswith(f"step:{max(I80_ALERTS.values()) + SUSTAIN + 1} - "))
    head = next(i for i, ln in enumerate(lines) if ln.startswith("step:1 - "))
    run = tmp_path / "i80"
    run.mkdir()
    log = run / "output.log"
    log.write_text("".join(lines[:head]))  # the config dump and start-up lines, before any step
    proc = _start([str(run), "--warehouse", str(tmp_path / "wh"), "--interval", "1"], _env(receiver.url))
    written: dict[int, float] = {}  # step -> when its line was written (time.monotonic())
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("watching ")  # it runs; the run's header is in
        deadline = time.monotonic() + 60  # the first (header-only) ingest lands before the steps start
        while "i80" not in published_runs(tmp_path / "wh") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "i80" in published_runs(tmp_path / "wh"), "the header-only run never landed"
        write_steps_at_pace(log, lines[head:end + 1], 0.5, written)
        deadline = time.monotonic() + 3 * LATENCY_TARGET_S
        while len(receiver.messages) < len(I80_ALERTS) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # a refresh more: nothing is sent twice
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Traceback" not in out
    got = notified_once(receiver, I80_ALERTS)
    latency = {k: got[k] - written[I80_ALERTS[k] + SUSTAIN - 1] for k in got}
    print("latency from the step line completing the alert to its notification: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in latency.items()))
    assert all(0 < v <= LATENCY_TARGET_S for v in latency.values()), latency
    steps = [ln for ln in out.splitlines() if ln.startswith(("steps ", "step "))]
    assert steps and all(len(ln) <= LINE_WIDTH for ln in steps)
    # the batches follow one another from step 1, past the step completing the last alert (the last
    # lines written may land after Ctrl-C on a loaded machine)
    spans = [[int(x) for x in ln.split(":")[0].split(" ")[1].split("-")] for ln in steps]
    assert spans[0][0] == 1 and all(b[0] == a[-1] + 1 for a, b in zip(spans, spans[1:], strict=False)), spans
    assert spans[-1][-1] >= max(I80_ALERTS.values()) + SUSTAIN - 1
    assert sum(ln.startswith("ALERT ERROR i80 ") for ln in out.splitlines()) == len(I80_ALERTS)
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("watch i80: stopped after ") and f"steps 1-{spans[-1][-1]}" in summary
    assert "2 alert(s), 2 notified" in summary


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_watch_stops_cleanly_on_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    log = tmp_path / "r.log"
    log.write_text(_console([100.0] * 4))
    proc = _start([str(log), "--warehouse", str(tmp_path / "wh"), "--interval", "0.2"], _env(None))
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("watching ")
    assert proc.stdout.readline().startswith("steps 1-4: ")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert out.strip().splitlines() == ["watch r: stopped after 1 refresh(es); steps 1-4; 0 alert(s)"]


def test_a_bad_notify_setting_is_a_usage_error_before_watching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    from analyses.cli import main

    log = tmp_path / "r.log"
    log.write_text(_console([100.0]))
    monkeypatch.setenv("POLYTRACE_NOTIFY", "not a url at all")
    assert main(["watch", str(log), "--warehouse", str(tmp_path / "wh")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an Apprise URL" in err[0]
    assert not (tmp_path / "wh").exists()
    monkeypatch.delenv("POLYTRACE_NOTIFY")
    assert main(["watch", str(log), "--interval", "0"]) == 2
