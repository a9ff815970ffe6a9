"""Health alerts that reach a person: read them from ``health_alerts``, send each new one once.

An alert is a row of the ``health_alerts`` view (rules, thresholds and severities:
:data:`analyses.views.training_health.ALERT_RULES`). Its identity is ``(run_id, kind,
first_step)``: a run that keeps collapsing raises the same alert at every refresh, and it is
sent once; a re-ingest that moves where the collapse starts (a resumed run re-logging its steps)
is a new alert.

Delivery goes through Apprise (Slack, e-mail, Discord, webhooks, ... -- any of its URL schemes),
configured by one setting, ``$POLYTRACE_NOTIFY``: one or more Apprise URLs separated by spaces
or commas, e.g. ``json://127.0.0.1:8099/`` or ``slack://T000/B000/XXXX``. What was sent is
remembered in ``<warehouse>/alerts/notified.json`` (for an ``s3://`` warehouse: in the reader's
local mirror), updated under a file lock so that the Dagster sensor and ``polytrace watch``
running at once never send one alert twice. An alert whose delivery failed is not remembered:
the next refresh tries it again, and the failure is one line (the endpoint, Apprise's reason).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

ENV_NOTIFY = "POLYTRACE_NOTIFY"
ALERTS_VIEW = "health_alerts"  # the view every alert is a row of
STATE_FILE = Path("alerts") / "notified.json"

ALERT_COLUMNS = ("run_id", "kind", "severity", "metric", "first_step", "last_step", "n_steps", "first_value",
                 "earlier_level", "threshold", "detail")


@dataclass(frozen=True)
class Alert:
    """One raised health alert (a ``health_alerts`` row)."""

    run_id: str
    kind: str
    severity: str  # error | warn
    metric: str
    first_step: int
    last_step: int
    n_steps: int
    first_value: float | None
    earlier_level: float | None
    threshold: float
    detail: str

    @property
    def key(self) -> str:
        return f"{self.run_id}|{self.kind}|{self.first_step}"

    @property
    def title(self) -> str:
        return f"PolyTrace {self.severity.upper()}: {self.kind} in run {self.run_id} from step {self.first_step}"

    @property
    def body(self) -> str:
        return (f"Run {self.run_id}: {self.kind} ({self.severity}) since step {self.first_step}. {self.detail}. "
                f"Last affected step {self.last_step}.")

    def line(self) -> str:
        """The alert on one line for a terminal (80 columns for a short run id)."""
        value = "" if self.first_value is None else f" value {self.first_value:.4g}"
        level = "" if self.earlier_level is None else f" (was {self.earlier_level:.4g})"
        return f"ALERT {self.severity.upper()} {self.run_id} {self.kind} step {self.first_step}{value}{level}"


def alerts_from_frame(df: pl.DataFrame) -> list[Alert]:
    """The alerts of ``health_alerts`` rows, ordered by run, first step and kind."""
    if df.height == 0:
        return []
    rows = df.select(ALERT_COLUMNS).sort("run_id", "first_step", "kind").iter_rows(named=True)
    return [Alert(**r) for r in rows]


def run_alerts(con: duckdb.DuckDBPyConnection, runs: Iterable[str] | None = None) -> list[Alert]:
    """The alerts raised so far by ``runs`` (default: every run), from a catalog connection."""
    from analyses.views import view_frame

    return alerts_from_frame(view_frame(con, ALERTS_VIEW, runs))


def notify_urls(setting: str | None = None) -> list[str]:
    """The Apprise URLs of ``setting`` (default ``$POLYTRACE_NOTIFY``); empty when unset."""
    raw = os.environ.get(ENV_NOTIFY, "") if setting is None else setting
    return [u for u in re.split(r"[\s,]+", raw.strip()) if u]


@dataclass
class Delivery:
    """What one :func:`deliver` did: alerts sent now, alerts sent before, failures with their reason."""

    sent: list[Alert] = field(default_factory=list)
    already: int = 0
    failed: list[tuple[Alert, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"notified: {a.title}" for a in self.sent]
        out += [f"notification failed: {a.kind} in run {a.run_id}: {why}" for a, why in self.failed]
        return out


class NotifyConfigError(ValueError):
    """``$POLYTRACE_NOTIFY`` holds something Apprise does not know as a URL."""


@contextmanager
def _quiet_apprise() -> Iterator[Any]:
    """The apprise module, imported on use (a command that sends nothing does not pay for it), with
    the DeprecationWarning of its ``imghdr`` import (on first use of a plugin) kept quiet."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import apprise

        yield apprise


def _apprise(urls: list[str]) -> Any:
    with _quiet_apprise() as apprise:
        ap = apprise.Apprise()
        with apprise.LogCapture(level=apprise.logging.ERROR):  # Apprise logs each refusal; we say it once
            bad = [u for u in urls if not ap.add(u)]
    if bad:
        raise NotifyConfigError(f"${ENV_NOTIFY}: not an Apprise URL: {', '.join(bad)}")
    return ap


def check_urls(urls: list[str]) -> None:
    """Raise :class:`NotifyConfigError` when Apprise does not know one of ``urls`` (say it at start,
    not at the first alert)."""
    _apprise(urls)


def _send(ap: Any, alert: Alert) -> str | None:
    """Send one alert; None when every URL took it, else Apprise's reason on one line."""
    with _quiet_apprise() as apprise, apprise.LogCapture(level=apprise.logging.WARNING) as log:
        ok = bool(ap.notify(title=alert.title, body=alert.body,
                            notify_type=apprise.NotifyType.FAILURE if alert.severity == "error"
                            else apprise.NotifyType.WARNING))
    if ok:
        return None
    reasons = [ln.split(" - ", 2)[-1].strip() for ln in log.getvalue().splitlines() if ln.strip()]
    return "; ".join(dict.fromkeys(reasons)) or "the endpoint did not accept the notification"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for one delivery round: a few requests at most
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _save(path: Path, state: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".notified.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(state, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def state_path(root: Path) -> Path:
    return root / STATE_FILE


def deliver(alerts: Iterable[Alert], urls: list[str], state: Path) -> Delivery:
    """Send every alert not sent before to ``urls``; remember each one that went out in ``state``.

    Safe to call from several processes at once (one lock round per call). Raises
    :class:`NotifyConfigError` for a URL Apprise does not know; an endpoint that is down is a
    failure in the result, not an exception.
    """
    out = Delivery()
    todo = list(alerts)
    if not urls or not todo:
        return out
    ap = _apprise(urls)
    with _locked(state):
        sent = _load(state)
        for a in todo:
            if a.key in sent:
                out.already += 1
                continue
            why = _send(ap, a)
            if why is not None:
                out.failed.append((a, why))
                continue
            sent[a.key] = {"sent_at": datetime.now(UTC).isoformat(timespec="seconds"), "title": a.title}
            _save(state, sent)
            out.sent.append(a)
    return out
