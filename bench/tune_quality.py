#!/usr/bin/env python3
"""Tuning quality on the GPU in hand: per problem, sweep the whole valid forward (or backward) space
(`flashgen tune`, no cap) and, as a user would, the capped space (`tune --max-candidates N`); then time
the exhaustive winner, the capped winner and the built-in choice against each other in one more sweep
(`tune --candidates`), which re-times them interleaved, so all three ratios rest on timings taken
together rather than minutes apart (the GPU's clock drifts by several percent over a long sweep).
Writes a CSV (device, date, versions) to bench/results/.

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

PROBLEMS = [  # (pass, dtype, head_dim, causal, batch, heads, seqlen): standard-grid points
    ("forward", "fp16", 64, "none", 4, 32, 4096),
    ("forward", "fp16", 64, "bottom-right", 4, 32, 4096),
    ("forward", "fp16", 128, "none", 4, 16, 4096),
    ("forward", "fp16", 128, "bottom-right", 4, 16, 4096),
    ("forward", "bf16", 128, "none", 1, 16, 16384),
    ("forward", "fp16", 256, "bottom-right", 4, 8, 4096),
    ("backward", "fp16", 128, "none", 4, 16, 4096),
    ("backward", "fp16", 64, "bottom-right", 4, 32, 4096),
    ("deterministic", "bf16", 128, "bottom-right", 4, 16, 4096),
]
PASS_FLAGS = {"forward": [], "backward": ["--backward"], "deterministic": ["--backward", "--deterministic"]}


def run_json(command):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout)


def write_csv(rows, out):
    device = rows[0]["device"].lower().replace(" ", "-")
    out = out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                              f"tune_quality_{device}_{rows[0]['date']}.csv")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"# wrote {out}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flashgen", default="build/flashgen", help="the flashgen CLI (default: build/flashgen)")
    parser.add_argument("--cap", type=int, default=16, help="candidates of the capped sweep (default: 16)")
    parser.add_argument("--out", help="CSV path (default: bench/results/tune_quality_<device>_<date>.csv)")
    parser.add_argument("--only", default=None,
                        help="comma-separated indices into the problem list (default: all of them)")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        full_db, capped_db, final_db = (os.path.join(tmp, n + ".sqlite") for n in ("full", "capped", "final"))
        chosen = PROBLEMS if args.only is None else [PROBLEMS[int(i)] for i in args.only.split(",")]
        for pass_name, dtype, head_dim, causal, batch, heads, seqlen in chosen:
            problem = PASS_FLAGS[pass_name] + ["--dtype", dtype, "--head-dim", str(head_dim), "--causal", causal, "--batch", str(batch),
                       "--heads-q", str(heads), "--heads-kv", str(heads), "--seqlen-q", str(seqlen),
                       "--seqlen-k", str(seqlen)]
            full = run_json([args.flashgen, "tune", "--json", "--force", "--db", full_db] + problem)
            capped = run_json([args.flashgen, "tune", "--json", "--force", "--db", capped_db,
                               "--max-candidates", str(args.cap)] + problem)
            finalists = list(dict.fromkeys([full["winner"], capped["winner"], full["heuristic"]]))
            together = run_json([args.flashgen, "tune", "--json", "--force", "--db", final_db,
                                 "--candidates", ",".join(finalists)] + problem)
            shown = run_json([args.flashgen, "db", "show", together["problem"], "--db", final_db, "--json"])
            entry = next(w for w in shown if w["device"] == together["device"])
            ms = {c["config"]: c["median_ms"] for c in entry["candidates"] if c["status"] == "ok"}
            best_ms = ms[full["winner"]]
            capped_ms = ms[capped["winner"]]
            heuristic_ms = ms.get(full["heuristic"])
            rows.append({
                "device": full["device"].split("|")[0],
                "date": datetime.date.today().isoformat(),
                "fingerprint": full["device"],
                "problem": full["problem"],
                "valid_configs": full["space"]["valid"],
                "pruned_configs": full["space"]["pruned"],
                "exhaustive_winner": full["winner"],
                "exhaustive_ms": best_ms,
                "capped_candidates": capped["candidates"],
                "capped_winner": capped["winner"],
                "capped_ms": capped_ms,
                "capped_vs_exhaustive": best_ms / capped_ms,
                "heuristic": full["heuristic"],
                "heuristic_ms": heuristic_ms,
                "heuristic_vs_exhaustive": best_ms / heuristic_ms if heuristic_ms else None,
                "sweep_s": full["sweep_s"],
                "compile_s": full["compile_s"],
                "check_and_timing_s": full["check_and_timing_s"],
                "capped_sweep_s": capped["sweep_s"],
            })
            r = rows[-1]
            print(f"{r['problem']}: exhaustive {r['exhaustive_winner']} {best_ms:.4f} ms of {r['valid_configs']}; "
                  f"capped({args.cap}) {r['capped_winner']} {r['capped_ms']:.4f} ms = {r['capped_vs_exhaustive']:.3f}x; "
                  f"built-in {r['heuristic_vs_exhaustive'] or 0:.3f}x (timed together); sweep {r['sweep_s']:.1f} s "
                  f"(compile {r['compile_s']:.1f} s), capped sweep {r['capped_sweep_s']:.1f} s", flush=True)
            write_csv(rows, args.out)  # after every problem: a cut-short run keeps what it measured

if __name__ == "__main__":
    main()
