"""Conformance suite: exports of the real PolyTrace runs, judged by their consumers (docs/conformance.md)."""
