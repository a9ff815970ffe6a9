"""``polytrace alerts``: the training-health alerts raised so far, and sending the new ones."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from analyses.cli.common import EXIT_FAIL, EXIT_OK, Command, UsageError, add_warehouse, warehouse


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", nargs="+", metavar="RUN", help="only these runs (default: every run)")
    p.add_argument("--notify", action="store_true",
                   help="send each alert not sent before to the Apprise URLs in $POLYTRACE_NOTIFY")
    p.add_argument("--format", choices=("table", "json"), default="table")
    add_warehouse(p)


def _run(args: argparse.Namespace) -> int:
    from analyses.alerts import ENV_NOTIFY, NotifyConfigError, notify_urls

    pt = warehouse(args)
    if args.notify and not notify_urls():
        raise UsageError(f"--notify needs ${ENV_NOTIFY} (one or more Apprise URLs, e.g. json://127.0.0.1:8099/)")
    alerts = pt.alerts(args.runs)
    if args.format == "json":
        sys.stdout.write(json.dumps([asdict(a) for a in alerts], indent=1) + "\n")
    elif not alerts:
        print("no alerts")
    else:
        for a in alerts:
            print(a.line())
            print(f"  {a.detail}")
    if not args.notify:
        return EXIT_OK
    try:
        done = pt.notify(alerts)
    except NotifyConfigError as exc:
        raise UsageError(str(exc)) from exc
    for line in done.lines():
        print(line, file=sys.stderr)
    return EXIT_FAIL if done.failed else EXIT_OK


COMMAND = Command(
    name="alerts",
    help="training-health alerts (collapses, clipping, throughput drops); --notify sends new ones",
    description="One line per alert raised so far (health_alerts: kind, severity, first step, the value there and "
    "the earlier level it fell from) with its detail. With --notify, each alert not sent before goes to the Apprise "
    "URLs in $POLYTRACE_NOTIFY (Slack, e-mail, Discord, webhooks, ...), once; a delivery that fails is said in one "
    "line, exits 1, and is tried again next time.",
    epilog="examples:\n  polytrace alerts\n  POLYTRACE_NOTIFY=json://127.0.0.1:8099/ polytrace alerts --notify",
    add_arguments=_arguments,
    run=_run,
)
