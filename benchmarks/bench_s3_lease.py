"""The S3 writer lease: taking and giving back a run's lease, by conditional writes against the
settle-and-verify lease a store that ignores them gets, side by side on moto's S3 server.

    .venv/bin/python benchmarks/bench_s3_lease.py          # 10 leases each, alternating
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from test_object_warehouse import moto_server  # noqa: E402  (moto is a dev dependency)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leases", type=int, default=10)
    a = ap.parse_args()
    with moto_server() as url:
        os.environ.update({"AWS_ENDPOINT_URL": url, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "bench",
                           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"})
        import pyarrow.fs as pafs

        from analyses import conditional_writes
        from analyses.objectstore import ObjectWarehouse

        bucket = "bench-lease"
        pafs.S3FileSystem(endpoint_override=url, scheme="http", access_key="bench", secret_key="bench",
                          region="us-east-1", allow_bucket_creation=True).create_dir(bucket)
        store = ObjectWarehouse(f"s3://{bucket}/w")
        with store.lease("warm-up", 5):  # boto3's import and the probe, once per process
            pass
        where = (str(store._conditional().client.meta.endpoint_url), bucket)
        times: dict[str, list[float]] = {"conditional writes": [], "settle and verify": []}
        for i in range(a.leases):
            for name, honoured in (("conditional writes", True), ("settle and verify", False)):
                conditional_writes._HONOURED[where] = honoured  # as if the probe had found so
                t = time.perf_counter()
                with store.lease(f"run-{i}", 5):
                    pass
                times[name].append(time.perf_counter() - t)
    for name, ts in times.items():
        print(f"{name}: best {min(ts) * 1e3:.1f} ms, median {sorted(ts)[len(ts) // 2] * 1e3:.1f} ms "
              f"per lease taken and given back ({len(ts)} leases)")
    print(f"ratio (settle and verify / conditional writes, medians): "
          f"{sorted(times['settle and verify'])[a.leases // 2] / sorted(times['conditional writes'])[a.leases // 2]:.0f}x")


if __name__ == "__main__":
    main()
