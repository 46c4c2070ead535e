"""training/attention_share.py on a synthetic byte corpus and the tiny model, on the CPU."""
import json
import os
import sys

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention_share  # noqa: E402
import model as M  # noqa: E402


def write_corpus(d, docs=40, seed=0):
    rng = np.random.default_rng(seed)
    lens = rng.integers(50, 400, size=docs)
    raw = rng.integers(0, 256, size=int(lens.sum()), dtype=np.uint8)
    offs = np.concatenate([[0], np.cumsum(lens)]).astype("<u4")
    raw.tofile(d / "train.bin")
    offs.tofile(d / "train_offsets.bin")
    (d / "meta.json").write_text(json.dumps({"name": "synthetic", "sources": []}))


def test_times_both_runs_and_restores_attention(tmp_path, capsys):
    write_corpus(tmp_path)
    out = tmp_path / "share.jsonl"
    real = M.attention
    rc = attention_share.main(["--recipe", "bf16", "--data-dir", str(tmp_path), "--model-size", "tiny",
                               "--pack-tokens", "1024", "--max-doc-len", "512", "--steps", "2", "--warmup", "1",
                               "--device", "cpu", "--out", str(out)])
    assert rc == 0
    assert M.attention is real  # the stand-in is undone
    res = json.loads(out.read_text().splitlines()[-1])
    assert res == json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["step_ms_with_attention"] > 0 and res["step_ms_without_attention"] > 0


def test_share_from_the_median_step_times(tmp_path, capsys, monkeypatch):
    # Known step times in place of the timed runs: medians 11 ms with attention, 6 without.
    write_corpus(tmp_path)
    times = {True: [0.010, 0.013, 0.011], False: [0.006, 0.005, 0.009]}
    monkeypatch.setattr(attention_share, "time_steps",
                        lambda args, device, corpus, with_attention: (times[with_attention], None))
    assert attention_share.main(["--recipe", "bf16", "--data-dir", str(tmp_path), "--model-size", "tiny",
                                 "--pack-tokens", "1024", "--max-doc-len", "512", "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["step_ms_with_attention"] == 11.0 and res["step_ms_without_attention"] == 6.0
    assert res["attention_ms"] == 5.0
    assert res["attention_share"] == pytest.approx(5.0 / 11.0, abs=1e-4)
    assert res["tokens_per_s"] == pytest.approx(1024 / 0.011, abs=0.1)
    assert "attention_peak_mib" not in res  # no peak without a GPU


def test_peak_memory_difference(tmp_path, capsys, monkeypatch):
    # A GPU run's peaks (MiB): what attention adds is the difference of the two runs'.
    write_corpus(tmp_path)
    runs = {True: ([0.010], 1500.0), False: ([0.006], 1200.0)}
    monkeypatch.setattr(attention_share, "time_steps", lambda args, device, corpus, with_attention: runs[with_attention])
    assert attention_share.main(["--recipe", "bf16", "--data-dir", str(tmp_path), "--model-size", "tiny",
                                 "--pack-tokens", "1024", "--max-doc-len", "512", "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["peak_mib_with_attention"] == 1500.0 and res["peak_mib_without_attention"] == 1200.0
    assert res["attention_peak_mib"] == 300.0


def test_stand_in_does_no_attention():
    q = torch.randn(8, 2, 4)
    assert attention_share.no_attention(q, None, None, None, 8, "bf16") is q


def test_low_memory_reaches_flamia(tmp_path, capsys, monkeypatch):
    # --low-memory: every flamia call of the run with attention takes low_memory=True.
    write_corpus(tmp_path)
    calls = []

    class StandIn:
        @staticmethod
        def attention(q, k, v, cu_seqlens, max_seqlen, causal, softmax_scale, recipe, low_memory=False):
            calls.append((recipe, low_memory))
            return q

    monkeypatch.setattr(M, "load_flamia", lambda: StandIn)
    monkeypatch.setattr(attention_share.TR, "check_recipe", lambda recipe, device: None)
    assert attention_share.main(["--recipe", "fp8_mixed", "--low-memory", "--data-dir", str(tmp_path),
                                 "--model-size", "tiny", "--pack-tokens", "1024", "--max-doc-len", "512",
                                 "--steps", "1", "--warmup", "0", "--device", "cpu"]) == 0
    assert calls and set(calls) == {("fp8_mixed", True)}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["low_memory"] is True
    with pytest.raises(SystemExit):
        attention_share.main(["--recipe", "bf16", "--low-memory", "--data-dir", str(tmp_path), "--device", "cpu"])
