"""resumable_sha256: OpenSSL's SHA-256 state continued across appends, from the libcrypto the
process has loaded already (hashlib's), found without starting a process."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_loading_starts_no_process_and_digests_equal_hashlibs() -> None:
    """ctypes.util.find_library('crypto') ran `ldconfig -p` in a subprocess at import (~4 ms of
    every ingest, more once Polars' memory is mapped)."""
    code = ("import sys\nimport analyses.resumable_sha256 as r\n"
            "print(r.available(), r._check_self(), sorted(m for m in ('subprocess', 'ctypes.util') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    if out.stdout.split()[0] == "False":
        pytest.skip("no libcrypto with SHA256_* here: callers hash whole files")
    assert out.stdout.strip() == "True True []"


def test_a_continued_state_gives_the_whole_digest() -> None:
    from analyses import resumable_sha256 as r

    if not r.available():
        pytest.skip("no libcrypto with SHA256_* here")
    data = bytes(range(256)) * 5000
    state = r.extend(None, data[:77777])
    assert r.digest(r.extend(state, data[77777:])) == hashlib.sha256(data).hexdigest()
