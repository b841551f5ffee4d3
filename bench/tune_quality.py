#!/usr/bin/env python3
"""Tuning quality on the GPU in hand: for a few problems, sweep the whole valid forward space
(`flashgen tune` with no cap), then a capped sweep of a few evenly spaced candidates, and compare both
winners and the built-in heuristic choice. Writes a CSV (device, date, versions) to bench/results/.

Run on a GPU machine after building:  python3 bench/tune_quality.py [--flashgen build/flashgen]
"""
import argparse
import csv
import datetime
import json
import os
import subprocess
import sys
import tempfile

PROBLEMS = [  # (head_dim, causal, batch, heads, seqlen): the standard grid's 4k point
    (64, "none", 4, 32, 4096),
    (64, "bottom-right", 4, 32, 4096),
    (128, "none", 4, 16, 4096),
    (128, "bottom-right", 4, 16, 4096),
]


def tune(flashgen, db, head_dim, causal, batch, heads, seqlen, cap):
    command = [flashgen, "tune", "--json", "--force", "--db", db, "--head-dim", str(head_dim), "--causal", causal,
               "--batch", str(batch), "--heads-q", str(heads), "--heads-kv", str(heads), "--seqlen-q", str(seqlen),
               "--seqlen-k", str(seqlen)]
    if cap:
        command += ["--max-candidates", str(cap)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flashgen", default="build/flashgen", help="the flashgen CLI (default: build/flashgen)")
    parser.add_argument("--cap", type=int, default=12, help="candidates of the capped sweep (default: 12)")
    parser.add_argument("--out", help="CSV path (default: bench/results/tune_<device>_<date>.csv)")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for head_dim, causal, batch, heads, seqlen in PROBLEMS:
            full = tune(args.flashgen, os.path.join(tmp, "full.sqlite"), head_dim, causal, batch, heads, seqlen, 0)
            capped = tune(args.flashgen, os.path.join(tmp, "capped.sqlite"), head_dim, causal, batch, heads, seqlen,
                          args.cap)
            device = full["device"].split("|")[0]
            row = {
                "device": device, "date": datetime.date.today().isoformat(), "fingerprint": full["device"],
                "problem": full["problem"], "valid_configs": full["space"]["valid"],
                "pruned_configs": full["space"]["pruned"],
                "exhaustive_winner": full["winner"], "exhaustive_ms": full["winner_ms"],
                "capped_candidates": capped["candidates"], "capped_winner": capped["winner"],
                "capped_ms": capped["winner_ms"],
                "capped_vs_exhaustive": full["winner_ms"] / capped["winner_ms"],
                "heuristic": full["heuristic"], "heuristic_ms": full["heuristic_ms"],
                "heuristic_vs_exhaustive": (full["winner_ms"] / full["heuristic_ms"]) if full["heuristic_ms"] else "",
                "exhaustive_sweep_s": full["sweep_s"], "exhaustive_compile_s": full["compile_s"],
                "exhaustive_check_and_timing_s": full["check_and_timing_s"],
                "capped_sweep_s": capped["sweep_s"],
            }
            rows.append(row)
            print(f"{row['problem']}: exhaustive {row['exhaustive_winner']} {row['exhaustive_ms']:.4f} ms "
                  f"({row['valid_configs']} configs, {row['exhaustive_sweep_s']:.0f} s); capped {row['capped_ms']:.4f} ms "
                  f"({row['capped_vs_exhaustive']:.3f}x); heuristic {row['heuristic_ms']} ms", flush=True)

    slug = rows[0]["device"].lower().replace(" ", "-")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"tune_{slug}_{rows[0]['date']}.csv")
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    print(f"# wrote {out}")


if __name__ == "__main__":
    main()
