"""The seed-sweep report of training/report.py on synthetic logs (no torch, no plots)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import report  # noqa: E402


def write_run(runs, recipe, seed, final, truncated=False, fp="same", corpus="alt", hd=64, tag=""):
    d = runs / f"{corpus}-hd{hd}{'-' + tag if tag else ''}" / f"{recipe}-seed{seed}"
    d.mkdir(parents=True)
    cfg = {"type": "config", "recipe": recipe, "seed": seed, "params": 1e6, "tokens_per_step": 4096,
           "model": {"head_dim": hd, "n_heads": 12, "n_kv_heads": 4}, "device": "test",
           "init_fingerprint": f"w{seed}" if fp == "same" else "other", "data_fingerprint": f"d{seed}",
           "corpus": {"name": corpus, "packages": ["git-doc"], "train_tokens": 1e6, "val_tokens": 1e5}}
    recs = [cfg]
    for step in (1, 2):
        recs.append({"type": "train", "step": step, "tokens": 4096 * step, "loss": 3.0, "grad_norm": 1.0,
                     "lr": 1e-3, "tok_per_s": 1e4})
    for step, v in ((1, final + 0.5), (2, final)):
        recs.append({"type": "eval", "step": step, "tokens": 4096 * step, "val_loss": v, "val_loss_sem": 0.01,
                     "val_packs": 2, "val_pack_losses": [v - 0.1, v + 0.1]})
    recs.append({"type": "end", "step": 2, "truncated": truncated})
    (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def run_report(tmp_path, *extra):
    md = tmp_path / "T.md"
    if not md.exists():
        md.write_text("# T\n\nintro\n")
    assert report.main(["--runs-dir", str(tmp_path / "runs"), "--md", str(md), "--no-plots", *extra]) == 0
    return md.read_text()


def test_no_runs_says_so_and_keeps_the_rest(tmp_path):
    (tmp_path / "runs").mkdir()
    text = run_report(tmp_path)
    assert text.startswith("# T\n\nintro\n")
    assert report.NO_SEED_RUNS in text
    assert report.SEEDS_BEGIN in text and report.SEEDS_END in text


def test_paired_gaps_interval_and_verdict(tmp_path):
    runs = tmp_path / "runs"
    # gaps +1 %, +2 %, +3 %: mean 2, interval 2 +- 4.303/sqrt(3) = [-0.48, +4.48] -> needs ~7 seeds
    for seed, (b, f) in {1: (2.0, 2.02), 2: (1.0, 1.02), 3: (1.0, 1.03)}.items():
        write_run(runs, "bf16", seed, b)
        write_run(runs, "fp8", seed, f)
    text = run_report(tmp_path)
    assert "+2.00 % [-0.48, +4.48]" in text
    assert "cannot tell yet, needs ~7 seeds" in text
    assert "+1.00, +2.00, +3.00" in text
    assert "| bf16 | 3 | 1.3333 ± 0.5774 |" in text
    # paired std 1.00: t(3)/sqrt(4) = 1.591, ..., t(6)/sqrt(7) = 0.925 <= 1 -> 7 seeds for +-1 %
    assert "| 1.00 % (7) |" in text
    assert "| 10k (1.00×) |" in text
    assert "Evaluations averaged, steps: 2." in text


def test_report_block_is_kept_when_runs_are_gone(tmp_path):
    runs = tmp_path / "runs"
    for seed in (1, 2):
        write_run(runs, "bf16", seed, 2.0)
        write_run(runs, "fp8", seed, 2.0 * (1 + 0.001 * seed))
    first = run_report(tmp_path)
    assert "within 1 %" in first
    for p in sorted(runs.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    assert run_report(tmp_path) == first


def test_unfinished_and_unpaired_runs_are_left_out(tmp_path):
    runs = tmp_path / "runs"
    for seed in (1, 2, 3):
        write_run(runs, "bf16", seed, 2.0)
    write_run(runs, "fp8", 1, 2.0)
    write_run(runs, "fp8", 2, 2.2, truncated=True)
    write_run(runs, "fp8", 3, 2.2, fp="differs")
    text = run_report(tmp_path)
    assert "fp8 seed 2: unfinished, left out" in text
    assert "fp8 seed 3: initial weights or packs differ from bf16's, not paired" in text
    assert "+0.00 % (one seed, no interval)" in text
    assert "cannot tell yet, needs at least 2 paired seeds (has 1)" in text


def test_average_of_last_evaluations(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "bf16", 1, 2.0)
    text = run_report(tmp_path, "--avg-last", "2")
    assert "| bf16 | 1 | 2.2500 ± – |" in text  # (2.5 + 2.0) / 2
    assert "Evaluations averaged, steps: 1, 2." in text


def test_curves_show_only_the_runs_the_tables_count(tmp_path):
    runs = tmp_path / "runs"
    for seed in (1, 2):
        write_run(runs, "bf16", seed, 2.0)
    write_run(runs, "fp8", 1, 2.0)
    write_run(runs, "fp8", 2, 2.2, truncated=True)
    write_run(runs, "per_token_fp8", 1, 2.2, truncated=True)
    logs = {recipe: {seed: report.read_log(runs / "alt-hd64" / f"{recipe}-seed{seed}" / "log.jsonl")
                     for seed in seeds}
            for recipe, seeds in (("bf16", (1, 2)), ("fp8", (1, 2)), ("per_token_fp8", (1,)))}
    shown = report.finished_runs(logs)
    assert sorted(shown) == ["bf16", "fp8"]
    assert sorted(shown["bf16"]) == [1, 2] and sorted(shown["fp8"]) == [1]


def test_pooled_over_the_settings_of_one_family(tmp_path):
    runs = tmp_path / "runs"
    # family "8M": alt-hd64 gaps -1, 0, +1 and default-hd128 gaps -2, 0 -> pooled -0.40 %, std 1.14,
    # t(4) = 2.776: half-width 1.416 -> [-1.82, +1.02]; family "8M-lr6e-4" has one setting: no line.
    for seed, f in {1: 0.99, 2: 1.00, 3: 1.01}.items():
        write_run(runs, "bf16", seed, 1.0, tag="8M")
        write_run(runs, "fp8", seed, f, tag="8M")
    for seed, f in {1: 0.98, 2: 1.00}.items():
        write_run(runs, "bf16", seed, 1.0, corpus="default", hd=128, tag="8M")
        write_run(runs, "fp8", seed, f, corpus="default", hd=128, tag="8M")
        write_run(runs, "bf16", seed, 1.0, tag="8M-lr6e-4")
        write_run(runs, "fp8", seed, f, tag="8M-lr6e-4")
    text = run_report(tmp_path)
    assert "- `fp8` over `alt-hd64-8M`, `default-hd128-8M`: -0.40 % [-1.82, +1.02] over 5 paired seeds" in text
    assert "one-sided: **cannot rule out more than 1 % worse (upper end +1.02 %)**" in text
    assert "`alt-hd64-8M-lr6e-4`," not in text.split("Pooled over")[1]
    assert report.setting_family("default-hd128-8M-lr6e-4") == "8M-lr6e-4"
    assert report.setting_family("alt-hd64") == ""
