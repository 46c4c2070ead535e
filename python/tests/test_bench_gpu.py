"""The harness's flamia implementation end to end on the GPU: every phase it times runs
(the quantization-only pass included) and the record carries times, not an error; with
--low-memory, fp8_mixed runs without its stored dS."""

import json

from flamia_testutil import require_gpu

torch = require_gpu()

from flamia import bench  # noqa: E402

ARGS = ["--impls", "flamia", "--iters", "1", "--warmup", "0"]


def flamia_records(out_dir):
    """The harness's flamia records in out_dir/bench.json: one per recipe."""
    doc = json.loads((out_dir / "bench.json").read_text())
    recs = [r for r in doc["records"] if r["impl"] == "flamia"]
    assert {r["recipe"] for r in recs} == {"fp8", "fp8_mixed"}
    return recs


def test_harness_times_every_flamia_phase(tmp_path):
    assert bench.main(["--workloads", "fixed-4k", *ARGS, "--out", str(tmp_path)]) == 0
    for r in flamia_records(tmp_path):
        assert not r.get("error"), r
        assert r["quant_ms"] > 0 and r["step_ms"] > r["fwd_ms"] > 0 and r["step_peak_mib"] > 0, r


def test_first_backward_of_a_process_at_fixed_16k(tmp_path):
    # With autograd's gradient materialization off, the harness's first record (fixed-16k,
    # fp8) failed in flamia_backward with cudaErrorInvalidValue while later calls in the same
    # process passed (docs/PERFORMANCE.md "Memory"): so the harness runs in a fresh process.
    import os
    import subprocess
    import sys

    import flamia

    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(flamia.__file__)))
    env["PYTHONPATH"] = pkg_root + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-m", "flamia.bench", "--workloads", "fixed-16k", *ARGS, "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    recs = flamia_records(tmp_path)
    assert all(not r.get("error") for r in recs), recs


def test_sustained_steps_carry_time_energy_and_clock(tmp_path):
    # 0.5 s a window: NVML's energy counter advances about every 0.1 s (a 0.05 s window read 0 J).
    assert bench.main(["--workloads", "fixed-4k", *ARGS, "--sustained", "0.5", "--out", str(tmp_path)]) == 0
    for r in flamia_records(tmp_path):
        s = r["sustained"]
        assert s["steps"] >= 3 and s["step_ms"] > 0, s
        # The step's own time bounds the back-to-back mean from below within launch noise.
        assert s["step_ms"] > 0.5 * r["step_ms"], (s, r["step_ms"])
        fwd = s["fwd"]
        assert fwd["calls"] >= 3 and 0.5 * r["fwd_ms"] < fwd["ms"] < s["step_ms"], (fwd, r["fwd_ms"])
        if s["watts"] is not None:  # NVML present (the driver's library)
            assert s["joules_per_step"] > 0 and 50 < s["watts"] < 2000 and s["sm_mhz"] > 0, s
            assert 0 < fwd["joules"] < s["joules_per_step"], s


def test_low_memory_runs_fp8_mixed_without_its_slab(tmp_path):
    # --low-memory: the flamia records say so, and fp8_mixed's step peaks below the default's
    # (no stored dS slab; fixed-4k's is ~200 MiB), while fp8's record is the same call.
    peaks = {}
    for low in (False, True):
        out = tmp_path / str(low)
        flags = ["--low-memory"] if low else []
        assert bench.main(["--workloads", "fixed-4k", *ARGS, "--out", str(out), *flags]) == 0
        assert json.loads((out / "bench.json").read_text())["flamia_low_memory"] is low
        for r in flamia_records(out):
            assert not r.get("error"), r
            assert ("low_memory=True" in r["notes"]) is low, r["notes"]
            peaks[low, r["recipe"]] = r["step_peak_mib"]
    assert peaks[True, "fp8_mixed"] < peaks[False, "fp8_mixed"] - 100, peaks
