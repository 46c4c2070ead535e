"""Tests that need neither torch nor a GPU: library discovery, error reporting, workloads."""

import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

import flamia
from flamia import _lib
from flamia.workloads import WORKLOADS, long_tailed_lengths

REPO = Path(__file__).resolve().parents[2]


def test_flamia_library_env_is_exclusive(monkeypatch, tmp_path):
    fake = tmp_path / "libflamia.so"
    monkeypatch.setenv("FLAMIA_LIBRARY", str(fake))
    assert _lib.candidate_paths() == [fake]
    assert _lib.library_path() is None  # not a file yet


def test_missing_library_raises_flamia_error(monkeypatch, tmp_path):
    monkeypatch.setenv("FLAMIA_LIBRARY", str(tmp_path / "nope" / "libflamia.so"))
    monkeypatch.setattr(_lib, "_lib", None)
    with pytest.raises(flamia.FlamiaError, match="libflamia.so not found"):
        _lib.get()
    assert not flamia.gpu_available()


def test_unloadable_library_raises_flamia_error(monkeypatch, tmp_path):
    bad = tmp_path / "libflamia.so"
    bad.write_bytes(b"not an ELF file")
    monkeypatch.setenv("FLAMIA_LIBRARY", str(bad))
    monkeypatch.setattr(_lib, "_lib", None)
    with pytest.raises(flamia.FlamiaError, match="cannot load"):
        _lib.get()


def test_recipe_names():
    assert _lib.recipe_id("fp8") == 0 and _lib.recipe_id("fp8_mixed") == 1
    with pytest.raises(flamia.FlamiaError, match="recipe"):
        _lib.recipe_id("fp16")


def test_backward_dq_path_is_the_library_s(monkeypatch):
    # The library reads FLAMIA_BWD_DQ (the Python refusals ask it, so the two cannot
    # disagree); a build without CUDA has no device backward and says recompute.
    lib = _lib.get()
    mixed, fp8 = _lib.recipe_id("fp8_mixed"), _lib.recipe_id("fp8")
    monkeypatch.delenv("FLAMIA_BWD_DQ", raising=False)
    if "cpu only" in lib.version():
        assert lib.backward_dq_path(mixed, 128) == _lib.DQ_RECOMPUTE
        return
    assert lib.backward_dq_path(mixed, 128) == _lib.DQ_STORED
    assert lib.backward_dq_path(fp8, 128) == lib.backward_dq_path(mixed, 64) == _lib.DQ_RECOMPUTE
    monkeypatch.setenv("FLAMIA_BWD_DQ", "hbm")
    assert lib.backward_dq_path(fp8, 64) == _lib.DQ_STORED_REQUIRED
    monkeypatch.setenv("FLAMIA_BWD_DQ", "fused")
    assert lib.backward_dq_path(mixed, 128) == _lib.DQ_FUSED
    assert lib.backward_dq_path(fp8, 128) == _lib.DQ_RECOMPUTE
    monkeypatch.setenv("FLAMIA_BWD_DQ", "Fused")
    with pytest.raises(flamia.FlamiaError, match="FLAMIA_BWD_DQ: 'Fused'"):
        lib.backward_dq_path(mixed, 128)


def test_struct_layout_matches_header(tmp_path):
    """Every field of the ctypes mirrors at the offset and size the C compiler gives it from
    include/flamia/flamia.h, and the structs' sizes agree."""
    import ctypes

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to read the header's layout")
    structs = (("flamia_tensor", _lib.Tensor), ("flamia_attention_args", _lib.AttentionArgs))
    body = []
    for cname, cls in structs:
        body.append(f'printf("{cname} sizeof %zu %zu\\n", sizeof({cname}), sizeof({cname}));')
        for field, _ in cls._fields_:
            body.append(f'printf("{cname} {field} %zu %zu\\n", offsetof({cname}, {field}), '
                        f'sizeof((({cname}*)0)->{field}));')
    src = tmp_path / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"flamia/flamia.h\"\n"
                   "int main(void) {\n  " + "\n  ".join(body) + "\n  return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c99", "-I", str(REPO / "include"), str(src), "-o", str(exe)], check=True)
    got = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        cname, field, offset, size = line.split()
        got[(cname, field)] = (int(offset), int(size))
    for cname, cls in structs:
        assert got[(cname, "sizeof")][0] == ctypes.sizeof(cls), cname
        for field, _ in cls._fields_:
            desc = getattr(cls, field)
            assert got[(cname, field)] == (desc.offset, desc.size), f"{cname}.{field}"


def test_long_tailed_packs_are_reproducible_and_full():
    a = long_tailed_lengths(32768, seed=7)
    assert a == long_tailed_lengths(32768, seed=7)
    assert sum(a) == 32768
    assert all(n <= 16384 for n in a) and all(n >= 64 for n in a[:-1])
    big = long_tailed_lengths(4_000_000, seed=1)
    assert 700 <= statistics.median(big) <= 1100  # exp(6.8) ~ 900


def test_workload_table():
    assert set(WORKLOADS) == {"fixed-4k", "fixed-8k", "fixed-16k", "fixed-32k", "pack-32k", "pack-128k",
                              "llama8b-pack", "llama1b-pack"}
    for w in WORKLOADS.values():
        assert sum(w.lengths) == w.total_tokens
        assert w.cu_seqlens[-1] == w.total_tokens
    w = WORKLOADS["fixed-4k"]
    assert w.fwd_flops() == 4 * 128 * 16 * 8 * (4096 * 4097 // 2)
    assert w.bwd_flops() == 2.5 * w.fwd_flops()


def test_bench_ragged_offsets_address_each_document():
    from flamia.bench import thd_ragged_offsets

    w = WORKLOADS["llama8b-pack"]
    offs = thd_ragged_offsets(w.cu_seqlens, {w.hq, w.hkv}, w.head_dim)
    for h in (w.hq, w.hkv):
        o = offs[h]
        assert len(o) == len(w.lengths) + 1 and o[0] == 0
        assert o[-1] == w.total_tokens * h * w.head_dim
        assert [b - a for a, b in zip(o, o[1:])] == [n * h * w.head_dim for n in w.lengths]


def test_bench_lists_the_cudnn_frontend_baselines():
    from flamia.bench import baseline_factories

    keys = [k for k, _ in baseline_factories()]
    assert "cudnn_thd" in keys and "cudnn_fp8" in keys


def test_bench_cudnn_fp8_skips_ragged_packs_unless_asked():
    from flamia.bench import baseline_factories

    class Inp:
        w = WORKLOADS["pack-32k"]

    fp8 = dict(baseline_factories())["cudnn_fp8"]
    with pytest.raises(NotImplementedError, match="--cudnn-fp8-ragged"):
        fp8(Inp())


def test_bench_records_round_trip_through_json(tmp_path):
    # --charts-from redraws a run's charts from its bench.json: the records must come back as
    # the run held them, extras (checks, speedups) included.
    import json

    from flamia.bench import Record, records_from_json

    rec = Record(workload="fixed-4k", impl="flamia", recipe="fp8_mixed", fwd_ms=1.15, step_ms=3.88,
                 errors={"o": 0.048}, notes=["n"])
    rec.extra = {"step_speedup_vs_best_baseline": 0.97, "checks": {"causal_bitwise": True}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"records": [rec.to_json()]}))
    (back,) = records_from_json(str(path))
    assert back.workload == "fixed-4k" and back.recipe == "fp8_mixed" and back.step_ms == 3.88
    assert back.errors == {"o": 0.048} and back.notes == ["n"]
    assert back.extra == rec.extra
    assert back.to_json() == rec.to_json()


def test_bench_sustained_speedups_use_the_sustained_steps(capsys):
    # The sustained ratios divide the fastest baseline's sustained step (and forward) by
    # flamia's, not the median steps (which rank the other way here), and leave records without
    # them alone.
    from flamia.bench import Record, add_speedups, sustained_table

    def rec(impl, recipe, step, sustained, fwd=None, precision="bf16"):
        r = Record(workload="fixed-8k", impl=impl, recipe=recipe, fwd_ms=1.0, step_ms=step, precision=precision)
        if sustained is not None:
            r.extra["sustained"] = {"steps": 10, "step_ms": sustained, "joules_per_step": 4.0, "watts": 690.0,
                                    "sm_mhz": 1600.0, "sm_mhz_min": 1500,
                                    "fwd": {"calls": 40, "ms": fwd, "joules": 1.0, "watts": 680.0, "sm_mhz": 1700.0,
                                            "sm_mhz_min": 1650}}
        return r

    recs = [rec("flamia", "fp8_mixed", 7.0, 8.0, 2.0, "fp8"), rec("sdpa_cudnn", "bf16", 7.5, 7.6, 1.9),
            rec("cudnn_fp8", "fp8_per_tensor", 6.4, 6.4, 1.5, "fp8"), rec("cudnn_thd", "bf16", 7.2, None)]
    add_speedups(recs)
    s = recs[0].extra["sustained"]
    assert s["best_baseline"] == "cudnn_fp8/fp8_per_tensor"
    assert s["step_speedup_vs_best_baseline"] == 0.8 and s["step_speedup_vs_best_bf16"] == 0.95
    assert s["fwd_speedup_vs_best_baseline"] == 0.75 and s["fwd_speedup_vs_best_bf16"] == 0.95
    assert recs[0].extra["step_speedup_vs_best_bf16"] == round(7.2 / 7.0, 3)  # the median steps' own
    assert "best_baseline" not in recs[1].extra["sustained"]
    sustained_table(recs)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and lines[-1] == ""
    row = lines[2].split()
    assert row[9:11] == ["0.80", "0.95"] and row[11] == "2.000" and row[-2:] == ["0.75", "0.95"]


def test_bench_markdown_table_marks_only_steps_faster_than_every_bf16_baseline():
    from flamia.bench import Record, markdown_table

    def rec(impl, recipe, step, precision="bf16", error=None):
        return Record(workload="pack-32k", impl=impl, recipe=recipe, fwd_ms=1.0, fwd_tflops=500.0, step_ms=step,
                      step_tflops=400.0, step_peak_mib=800.0, precision=precision, error=error)

    recs = [rec("flamia", "fp8", 4.5, "fp8"), rec("flamia", "fp8_mixed", 4.0, "fp8"), rec("cudnn_thd", "bf16", 4.2),
            rec("fa2_varlen_torch", "bf16", 7.0), rec("sdpa_cudnn", "bf16", 1.0, error="no plan")]
    table = markdown_table(recs, {"pack-32k": {"lengths_summary": {"docs": 19}}})
    step = next(line for line in table.splitlines() if "step ms" in line)
    cells = [c.strip() for c in step.strip("|").split("|")]
    # fp8 (4.5) is slower than cuDNN ragged (4.2): not bold; fp8_mixed (4.0) is faster than both.
    assert cells[:4] == ["pack-32k (19 docs)", "step ms (TFLOPS)", "4.50 (400)", "**4.00 (400)**"]
    # The failed baseline is no column and no reference; the others keep their order.
    header = table.splitlines()[0]
    assert "cuDNN SDPA BF16" not in header and header.index("cuDNN ragged") < header.index("FA2 varlen")
