"""The export registry is the one list of formats: the CLI's choices, the docs table and the
Dagster asset's description are derived from it, and each format lives in its own module."""

from __future__ import annotations

import re
from pathlib import Path

from analyses.cli import build_parser
from analyses.export.registry import export_format, export_formats, format_names
from pipelines.assets.export import workload_exports

DOC = Path(__file__).resolve().parents[1] / "docs" / "spec.md"


def test_each_format_is_one_module_with_a_consumer() -> None:
    fmts = export_formats()
    assert len({f.name for f in fmts}) == len(fmts) >= 6
    for f in fmts:
        assert f.write.__module__.startswith("analyses.export.formats.")
        assert f.consumer and f.loader and f.files and f.try_it
        assert export_format(f.name) is f


def test_cli_choices_come_from_the_registry() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001 - argparse has no public accessor
    for cmd in ("export", "sample"):
        fmt = next(a for a in sub.choices[cmd]._actions if a.dest == "format")  # noqa: SLF001
        assert tuple(fmt.choices) == format_names()


def test_docs_table_and_asset_name_every_format() -> None:
    documented = re.findall(r"^\| `([\w-]+)` \| `", DOC.read_text(), re.M)
    assert set(format_names()) <= set(documented)
    desc = workload_exports.descriptions_by_key[workload_exports.key]
    assert all(f"`{n}`" in desc for n in format_names())


def test_docs_consumer_table_is_the_registrys() -> None:
    from analyses.export.registry import consumer_table

    m = re.search(r"<!-- consumer-table -->\n(.*?)\n<!-- /consumer-table -->", DOC.read_text(), re.S)
    assert m, "docs/spec.md has no consumer table"
    assert m.group(1) == consumer_table()
