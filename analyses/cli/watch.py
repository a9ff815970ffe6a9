"""``polytrace watch``: follow a run while it is written (analyses.watch), until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from analyses.cli.common import EXIT_OK, Command, UsageError, add_warehouse, warehouse


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, metavar="PATH", help="run directory or single log file to follow")
    p.add_argument("--run-id", help="run id (default: directory name or run.toml)")
    p.add_argument("--interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between two looks at the files (default 2)")
    add_warehouse(p)


class _Stopped(Exception):
    """SIGTERM: stop as Ctrl-C does."""


class _SignalGate:
    """Ctrl-C and SIGTERM stop the watcher wherever they land (an interrupted ingest publishes
    nothing), except inside :meth:`hold`: there a line is printed and counted for the summary, and a
    signal waits until both are done, so the summary never names a step no line showed."""

    def __init__(self, stopping: threading.Event) -> None:
        self.stopping = stopping
        self.held = 0
        self.pending: type[BaseException] | None = None

    def on_signal(self, sig: int, _frame: FrameType | None) -> None:
        self.stopping.set()
        exc = KeyboardInterrupt if sig == signal.SIGINT else _Stopped
        if self.held:
            self.pending = exc
            return
        raise exc

    @contextmanager
    def hold(self) -> Iterator[None]:
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1
            if not self.held and self.pending is not None:
                exc, self.pending = self.pending, None
                raise exc


def _run(args: argparse.Namespace) -> int:
    from analyses.alerts import ENV_NOTIFY, NotifyConfigError, check_urls, notify_urls
    from analyses.manifest import ManifestError, RunIdError
    from analyses.watch import DEFAULT_INTERVAL_S, Watcher, watch

    interval = DEFAULT_INTERVAL_S if args.interval is None else args.interval
    if interval <= 0:
        raise UsageError("--interval must be > 0 seconds")
    if not args.path.exists():
        raise UsageError(f"{args.path}: no such file or directory")
    urls = notify_urls()
    if urls:
        try:
            check_urls(urls)  # a bad $POLYTRACE_NOTIFY is said before the first refresh, not at the first alert
        except NotifyConfigError as exc:
            raise UsageError(str(exc)) from exc
    pt = warehouse(args, must_exist=False)
    pt.prepare()
    try:
        w = Watcher(pt, args.path, args.run_id, urls)
    except (ManifestError, RunIdError) as exc:
        raise UsageError(f"{args.path}: {exc}") from exc
    print(f"watching {args.path} as run {w.run_id} every {interval:g} s "
          f"({'notifying ' + ENV_NOTIFY if urls else 'no notifications: ' + ENV_NOTIFY + ' unset'}); Ctrl-C stops",
          flush=True)
    stop = threading.Event()
    stopping = threading.Event()  # Ctrl-C or SIGTERM arrived: whatever it interrupted is the stop
    gate = _SignalGate(stopping)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, gate.on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    try:
        watch(w, interval, stop, lambda line: print(line, flush=True),
              lambda line: print(f"polytrace watch: {line}", file=sys.stderr, flush=True), gate.hold)
    except (KeyboardInterrupt, _Stopped):
        # an ingest interrupted midway published nothing (its staging is dropped): the previous version stays
        pass
    except Exception:
        # DuckDB turns a signal that arrives inside a statement into its own error ("Query interrupted")
        if not stopping.is_set():
            raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    print(w.summary(), flush=True)
    return EXIT_OK


COMMAND = Command(
    name="watch",
    help="follow a run while it is written: new steps and alerts as they land (Ctrl-C stops)",
    description="Follow PATH (a run directory or one log file): each time a file grows or changes, ingest the run "
    "again (only the appended lines when the files just grew), print one line per batch of new steps (mean "
    "response length, reward, entropy, clip ratio and step time) and one per new health alert, and send each new "
    "alert once to the Apprise URLs in $POLYTRACE_NOTIFY when it is set (the same once-only state as `polytrace "
    "alerts --notify`). Ctrl-C or SIGTERM stops it with a one-line summary (exit 0).",
    epilog="examples:\n  polytrace watch logs/my-run\n"
    "  POLYTRACE_NOTIFY=json://127.0.0.1:8099/ polytrace watch train.log --run-id qwen --interval 5",
    add_arguments=_arguments,
    run=_run,
)
