"""Which version of each consumer the export formats were checked against (the conformance suite,
docs/conformance.md): one place, read by every ``ExportFormat.checked_against`` and asserted equal
to the versions the suite installs and models (tests/conformance)."""

from __future__ import annotations

UPSTREAM_POLYTRACE_REPO = "Zhou-jiecheng/PolyTrace"
UPSTREAM_POLYTRACE_COMMIT = "4246156f711a3990e26de1623ef3f726874a1013"  # ../shared/upstream/PolyTrace/PROVENANCE.md
UPSTREAM_POLYTRACE = f"{UPSTREAM_POLYTRACE_REPO} at {UPSTREAM_POLYTRACE_COMMIT[:12]} (modelled from PROVENANCE.md)"
AIPERF_VERSION = "0.13.0"
VIDUR_VERSION = "0.0.26"
AIPERF = f"aiperf {AIPERF_VERSION} (PyPI, run by the suite)"
VIDUR = f"vidur {VIDUR_VERSION} (PyPI, run by the suite)"
