#!/usr/bin/env python3
"""A sweep split into its two phases, measured against the same sweep on the GPUs alone: first `flashgen tune
--devices all` from a cold kernel cache (the GPU host compiles and times); then `flashgen compile --spec` as
--workers shards at once into another cold cache (CPU work, as CPU nodes of a cluster would run it; the GPUs idle),
followed by `flashgen tune --devices all` reading that cache (the GPU phase). Checks that the GPU phase compiled
nothing (the cache holds as many entries after it as before) and that both sweeps stored a winner for every problem.

    python3 bench/split_phase_tune.py [--flashgen build/flashgen] [--candidates 8] [--workers 4] [--jobs 8]

The problems are bench/multi_gpu_tune.py's (the standard grid's forward problems and a slice of each shipped spec).
Writes bench/results/split_phase_tune_<GPUs>x_<device>_<date>.csv (one row per phase: wall seconds, workers or
GPUs, kernels compiled, winners) and prints the GPU phase's and both phases' wall time as a share of the cold sweep's.
"""
import argparse
import csv
import datetime
import json
import os
import subprocess
import sys
import time

from multi_gpu_tune import REPO_ROOT, database, spec_problems


def cache_entries(path):
    return sum(len(files) for _, _, files in os.walk(path)) if os.path.isdir(path) else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flashgen", default=os.path.join(REPO_ROOT, "build", "flashgen"), help="the CLI to run")
    parser.add_argument("--candidates", type=int, default=8, help="--max-candidates of every sweep (default 8)")
    parser.add_argument("--workers", type=int, default=4, help="compile shards run at once (default 4)")
    parser.add_argument("--jobs", type=int, default=8, help="compile threads of each shard (default 8)")
    parser.add_argument("--work", default="/tmp/flashgen_split_phase", help="scratch folder (caches, databases)")
    parser.add_argument("--out", help="the CSV (default bench/results/split_phase_tune_<device>_<date>.csv)")
    args = parser.parse_args()

    listing = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True).stdout.split("\n")
    gpus = [name.strip() for name in listing if name.strip()]
    device = f"{len(gpus)}x {gpus[0]}"
    today = datetime.date.today().isoformat()
    out = args.out or os.path.join(REPO_ROOT, "bench", "results",
                                   f"split_phase_tune_{len(gpus)}x_{gpus[0].lower().replace(' ', '-')}_{today}.csv")
    version = subprocess.run([args.flashgen, "--version"], capture_output=True, text=True).stdout.strip()
    os.makedirs(args.work, exist_ok=True)
    spec = os.path.join(args.work, "spec.json")
    problems = spec_problems()
    with open(spec, "w") as f:
        json.dump({"max_candidates": args.candidates, "problems": problems}, f, indent=1)
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            failures.append(what)

    def tune(run, cache, db):
        env = dict(os.environ, FLASHGEN_CACHE_DIR=cache)
        with open(os.path.join(args.work, f"{run}.log"), "w") as log:
            start = time.monotonic()
            proc = subprocess.run([args.flashgen, "tune", "--spec", spec, "--devices", "all", "--db", db, "--json"],
                                  env=env, stdout=subprocess.PIPE, stderr=log, text=True)
            wall = time.monotonic() - start
        print(f"{run}: exit {proc.returncode} after {wall:.1f} s", flush=True)
        check(proc.returncode == 0, f"{run}: tune exits 0")
        return wall

    rows = []
    # 1. The GPUs alone, from a cold cache.
    cold_cache, cold_db = os.path.join(args.work, "cache_cold"), os.path.join(args.work, "cold.sqlite")
    cold_wall = tune("gpus_alone", cold_cache, cold_db)
    cold_winners, _ = database(cold_db)
    rows.append({"phase": "gpus_alone", "workers": len(gpus), "wall_s": cold_wall,
                 "kernels_compiled": cache_entries(cold_cache), "winners": len(cold_winners)})

    # 2. The compile phase: --workers shards at once, each with --jobs threads, into a cold cache.
    split_cache, split_db = os.path.join(args.work, "cache_split"), os.path.join(args.work, "split.sqlite")
    start = time.monotonic()
    procs = [subprocess.Popen([args.flashgen, "compile", "--spec", spec, "--arch", "90", "--shard",
                               f"{i}/{args.workers}", "-j", str(args.jobs), "--cache-dir", split_cache, "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for i in range(args.workers)]
    summaries = [json.loads(p.communicate()[0] or "null") for p in procs]
    compile_wall = time.monotonic() - start
    print(f"compile phase: {args.workers} shards in {compile_wall:.1f} s", flush=True)
    check(all(p.returncode == 0 for p in procs), "compile phase: every shard exits 0")
    compiled = sum(s["compiled"] for s in summaries if s)
    check(sum(s["failed"] for s in summaries if s) == 0, "compile phase: no kernel failed")
    rows.append({"phase": "compile", "workers": args.workers, "wall_s": compile_wall, "kernels_compiled": compiled,
                 "winners": ""})

    # 3. The GPU phase, reading the filled cache.
    before = cache_entries(split_cache)
    time_wall = tune("gpu_phase", split_cache, split_db)
    after = cache_entries(split_cache)
    check(after == before, f"GPU phase: compiled nothing ({after - before} new cache entries)")
    split_winners, _ = database(split_db)
    check(set(split_winners) == set(cold_winners) and len(cold_winners) == len(problems),
          f"both sweeps store a winner for each of the {len(problems)} problems")
    rows.append({"phase": "gpu_phase", "workers": len(gpus), "wall_s": time_wall, "kernels_compiled": after - before,
                 "winners": len(split_winners)})

    with open(out, "w", newline="") as f:
        fields = ["device", "date", "flashgen_version", "problems", "max_candidates", "phase", "workers", "wall_s",
                  "kernels_compiled", "winners"]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({"device": device, "date": today, "flashgen_version": version, "problems": len(problems),
                             "max_candidates": args.candidates,
                             **{k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in row.items()}})
    print(f"\nGPUs alone {cold_wall:.1f} s; compile phase {compile_wall:.1f} s on {args.workers} workers, GPU phase "
          f"{time_wall:.1f} s on {len(gpus)} GPUs: GPU phase {time_wall / cold_wall:.0%} of the GPUs-alone wall, "
          f"both phases {(compile_wall + time_wall) / cold_wall:.0%}")
    print(f"\n{len(failures)} checks failed" if failures else "\nevery check passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
