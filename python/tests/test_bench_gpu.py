"""The harness's flamia implementation end to end on the GPU: every phase it times runs
(the quantization-only pass included) and the record carries times, not an error."""

import json

from flamia_testutil import require_gpu

torch = require_gpu()

from flamia import bench  # noqa: E402


def test_harness_times_every_flamia_phase(tmp_path):
    rc = bench.main(["--workloads", "fixed-4k", "--impls", "flamia", "--iters", "1", "--warmup", "0",
                     "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "bench.json").read_text())
    recs = [r for r in doc["records"] if r["impl"] == "flamia"]
    assert {r["recipe"] for r in recs} == {"fp8", "fp8_mixed"}
    for r in recs:
        assert not r.get("error"), r
        assert r["quant_ms"] > 0 and r["step_ms"] > r["fwd_ms"] > 0 and r["step_peak_mib"] > 0, r
