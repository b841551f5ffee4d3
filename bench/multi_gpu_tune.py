#!/usr/bin/env python3
"""flashgen tune across the GPUs of one host, measured: the same spec tuned by one GPU and by every GPU
(`tune --devices`), each from a cold kernel cache of its own, with every GPU's utilisation sampled by nvidia-smi;
then a sweep in which one worker aborts at a named candidate (FLASHGEN_TEST_CRASH_CONFIG) and another is killed
with SIGKILL mid-sweep; then two independent `flashgen tune` processes, one per GPU, writing one database file at
once. Each run's database is checked with sqlite3: the multi-GPU database must hold every problem of the one-GPU
database once, with a winner, and every candidate row the one-GPU run stored; the crashed candidates must be
stored as crashed and nothing else lost; the shared file must hold both processes' rows.

    python3 bench/multi_gpu_tune.py [--flashgen build/flashgen] [--out DIR] [--candidates 4]

Needs two or more GPUs and nvidia-smi. Writes under --out (default bench/results/multi_gpu_<device>_<date>/):
summary.csv (one row per run: wall seconds, problems, winners, candidate rows, crashes, checks), utilisation.csv
(the nvidia-smi samples), utilisation.png (when matplotlib is there), spec.json and each run's log. Exits 1 when a
check fails.
"""
import argparse
import csv
import datetime
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spec_problems():
    """The standard grid's forward problems, and a slice of each other shipped spec: backward, variants, decode,
    packed batches (every problem class the tuner keys)."""
    forward = [{"pass": "forward", "dtype": dtype, "head_dim": d, "causal": causal, "batch": 16384 // n,
                "heads_q": 2048 // d, "heads_kv": 2048 // d, "seqlen_q": n, "seqlen_k": n}
               for dtype in ("fp16", "bf16") for d in (64, 128) for n in (1024, 16384)
               for causal in ("none", "bottom-right")]

    def shipped(name, picks):
        with open(os.path.join(REPO_ROOT, "bench", name)) as f:
            problems = json.load(f)["problems"]
        return [problems[i] for i in picks]

    return (forward + shipped("tune_bwd_spec.json", [0, 1, 3, 5, 24, 25, 27, 29])
            + shipped("tune_variants_spec.json", [0, 1, 2, 3])
            + shipped("tune_decode_spec.json", [0, 5, 11, 17, 23, 35])
            + shipped("tune_varlen_spec.json", [0, 3, 6, 9]))


class Sampler:
    """nvidia-smi's utilisation of every GPU every 200 ms, tagged with the run going on."""

    def __init__(self, path):
        self.file = open(path, "w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(["t_s", "run", "gpu", "util_pct", "mem_mib"])
        self.run = "idle"
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                                      "--format=csv,noheader,nounits", "-lms", "200"],
                                     stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 3:
                self.writer.writerow([f"{time.monotonic() - self.t0:.2f}", self.run, *fields])

    def close(self):
        self.proc.terminate()
        self.proc.wait()
        self.thread.join()
        self.file.close()


def database(path):
    """(winners {problem: config}, candidate rows {(problem, config): status}) of a tuning database."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    winners = dict(db.execute("SELECT problem_id, config_name FROM winners"))
    problems = [row[0] for row in db.execute("SELECT problem_id FROM winners")]
    assert len(problems) == len(set(problems))
    rows = {(p, c): s for p, c, s in db.execute("SELECT problem_id, config_name, status FROM candidates")}
    db.close()
    return winners, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flashgen", default=os.path.join(REPO_ROOT, "build", "flashgen"), help="the CLI to run")
    parser.add_argument("--out", help="folder for the results (default bench/results/multi_gpu_<device>_<date>/)")
    parser.add_argument("--candidates", type=int, default=4, help="--max-candidates of every sweep (default 4)")
    args = parser.parse_args()

    listing = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True).stdout.split("\n")
    gpus = [name.strip() for name in listing if name.strip()]
    if len(gpus) < 2:
        sys.exit(f"needs two or more GPUs; nvidia-smi lists {len(gpus)}")
    device = f"{len(gpus)}x {gpus[0]}"
    slug = gpus[0].lower().replace(" ", "-")
    today = datetime.date.today().isoformat()
    out = args.out or os.path.join(REPO_ROOT, "bench", "results", f"multi_gpu_{len(gpus)}x_{slug}_{today}")
    os.makedirs(out, exist_ok=True)
    version = subprocess.run([args.flashgen, "--version"], capture_output=True, text=True).stdout.strip()

    problems = spec_problems()
    spec = os.path.join(out, "spec.json")
    with open(spec, "w") as f:
        json.dump({"max_candidates": args.candidates, "problems": problems}, f, indent=1)
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    sampler = Sampler(os.path.join(out, "utilisation.csv"))
    summary = []
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            failures.append(what)
        return ok

    def tune(run, extra, cache, env_extra=None, during=None):
        """Runs `flashgen tune --spec ... extra` with its own kernel cache; returns (wall s, JSON summary)."""
        env = dict(os.environ, FLASHGEN_CACHE_DIR=os.path.join(work, cache), **(env_extra or {}))
        log = open(os.path.join(out, f"{run}.log"), "w")
        sampler.run = run
        start = time.monotonic()
        proc = subprocess.Popen([args.flashgen, "tune", "--spec", spec, "--json", *extra], env=env,
                                stdout=subprocess.PIPE, stderr=log, text=True)
        if during:
            during(proc)
        stdout, _ = proc.communicate()
        wall = time.monotonic() - start
        sampler.run = "idle"
        log.close()
        print(f"{run}: exit {proc.returncode} after {wall:.1f} s", flush=True)
        return wall, proc.returncode, json.loads(stdout) if stdout.strip() else None

    # 1. One GPU, then every GPU, each from a cold cache of its own.
    one_db, all_db = os.path.join(work, "one_gpu.sqlite"), os.path.join(work, "all_gpus.sqlite")
    one_wall, rc, _ = tune("one_gpu", ["--devices", "0", "--db", one_db], "cache_one")
    check(rc == 0, "one GPU: tune exits 0")
    all_wall, rc, result = tune("all_gpus", ["--devices", "all", "--db", all_db], "cache_all")
    check(rc == 0 and result is not None and not result["failed_workers"], "every GPU: tune exits 0, no failed worker")
    one_winners, one_rows = database(one_db)
    all_winners, all_rows = database(all_db)
    check(set(all_winners) == set(one_winners) and len(all_winners) > 0,
          f"every GPU: the merged database holds the one-GPU run's {len(one_winners)} problems, each once "
          f"({len(all_winners)} winners)")
    check(set(all_rows) == set(one_rows),
          f"every GPU: the same {len(one_rows)} candidate rows as one GPU ({len(all_rows)})")
    same = sum(all_winners[p] == one_winners.get(p) for p in all_winners)
    print(f"winners the same on both runs: {same} of {len(all_winners)}; speed-up {one_wall / all_wall:.2f}x on "
          f"{len(gpus)} GPUs", flush=True)
    summary += [{"run": "one_gpu", "gpus": 1, "wall_s": one_wall, "winners": len(one_winners),
                 "candidate_rows": len(one_rows), "crashes": 0, "speedup": 1.0},
                {"run": "all_gpus", "gpus": len(gpus), "wall_s": all_wall, "winners": len(all_winners),
                 "candidate_rows": len(all_rows), "crashes": 0, "speedup": one_wall / all_wall,
                 "same_winner": same}]

    # 2. A worker aborts at a named candidate and another is killed with SIGKILL while it tunes; the kernels are
    # cached by now, so this sweep is mostly timing.
    # The victim: a forward candidate of one problem only, so one worker meets it once.
    uses = {}
    for (_, c) in one_rows:
        uses[c] = uses.get(c, 0) + 1
    victim = sorted(c for c, n in uses.items() if n == 1 and c.startswith("fwd_"))[0]
    crash_db = os.path.join(work, "crash.sqlite")
    killed = {}

    def kill_a_worker(proc):
        # Waits for worker 1's first candidate to be launched (its journal names it), then kills it.
        journal = crash_db + ".workers/gpu1.journal"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(journal) and os.path.getsize(journal) > 0:
                break
            time.sleep(0.05)
        time.sleep(1.0)
        workers = subprocess.run(["pgrep", "-f", "--", f"--worker .*{crash_db}"], capture_output=True,
                                 text=True).stdout
        for pid in workers.split():
            with open(f"/proc/{pid}/cmdline") as f:
                cmdline = f.read().split("\0")
            if f"1/{len(gpus)}" in cmdline:
                os.kill(int(pid), signal.SIGKILL)
                killed["pid"] = int(pid)
                print(f"killed worker 1 (pid {pid})", flush=True)
                return

    crash_wall, rc, result = tune("crash_and_kill", ["--devices", "all", "--db", crash_db], "cache_all",
                                  {"FLASHGEN_TEST_CRASH_CONFIG": victim}, kill_a_worker)
    crash_winners, crash_rows = database(crash_db)
    crashes = result["crashes"] if result else []
    check(rc == 0 and result is not None and not result["failed_workers"], "crash and kill: tune exits 0")
    check(any(c["config"] == victim and c["how"] == "signal 6" for c in crashes),
          f"crash and kill: the aborting candidate {victim} is reported")
    kills = [c for c in crashes if c["how"] == "signal 9"]
    check("pid" in killed and len(kills) == 1 and kills[0]["device"] == 1,
          f"crash and kill: the killed worker is reported once, on GPU 1, with its candidate ({kills})")
    killed["config"] = kills[0]["config"] if kills else None
    check(set(crash_winners) == set(one_winners), "crash and kill: every problem has a winner")
    lost = set(one_rows) - set(crash_rows)
    crashed = {k for k, s in crash_rows.items() if s == "crashed"}
    check(not lost, f"crash and kill: no candidate row lost ({len(lost)} missing)")
    check({c for (_, c) in crashed} <= {victim, killed.get("config")} and len(crashed) >= 2,
          f"crash and kill: only the two culprits stored as crashed ({len(crashed)} rows)")
    check(all(crash_winners[p] not in (victim, killed.get("config")) for p in crash_winners),
          "crash and kill: no crashed candidate won")
    summary.append({"run": "crash_and_kill", "gpus": len(gpus), "wall_s": crash_wall, "winners": len(crash_winners),
                    "candidate_rows": len(crash_rows), "crashes": len(crashes)})

    # 3. Two independent tune processes, one per GPU, into one database file at once.
    shared_db = os.path.join(work, "shared.sqlite")
    halves = [problems[0::2], problems[1::2]]
    procs = []
    sampler.run = "two_processes"
    start = time.monotonic()
    for gpu, half in enumerate(halves):
        half_spec = os.path.join(work, f"half{gpu}.json")
        with open(half_spec, "w") as f:
            json.dump({"max_candidates": args.candidates, "problems": half}, f)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), FLASHGEN_CACHE_DIR=os.path.join(work, "cache_all"))
        log = open(os.path.join(out, f"two_processes_gpu{gpu}.log"), "w")
        procs.append(subprocess.Popen([args.flashgen, "tune", "--spec", half_spec, "--db", shared_db, "--json"],
                                      env=env, stdout=subprocess.PIPE, stderr=log, text=True))
    results = [json.loads(p.communicate()[0] or "null") for p in procs]
    two_wall = time.monotonic() - start
    sampler.run = "idle"
    check(all(p.returncode == 0 for p in procs), "two processes: both exit 0")
    shared_winners, shared_rows = database(shared_db)
    stored = sum(1 for r in results for entry in (r or []) if entry.get("winner"))
    check(set(shared_winners) == set(one_winners),
          f"two processes: one file holds every problem ({len(shared_winners)} of {len(one_winners)})")
    check(set(shared_rows) == set(one_rows), f"two processes: no row lost ({len(shared_rows)} of {len(one_rows)})")
    summary.append({"run": "two_processes_one_file", "gpus": 2, "wall_s": two_wall, "winners": len(shared_winners),
                    "candidate_rows": len(shared_rows), "crashes": 0, "stored_by_processes": stored})
    sampler.close()

    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        fields = ["device", "date", "flashgen_version", "problems", "max_candidates", "run", "gpus", "wall_s",
                  "speedup", "winners", "same_winner", "candidate_rows", "crashes", "stored_by_processes"]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in summary:
            writer.writerow({"device": device, "date": today, "flashgen_version": version, "problems": len(problems),
                             "max_candidates": args.candidates,
                             **{k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in row.items()}})
    plot(out, len(gpus))
    print("\n| run | GPUs | wall s | speed-up | winners | candidate rows | crashes |\n|---|---|---|---|---|---|---|")
    for row in summary:
        print(f"| {row['run']} | {row['gpus']} | {row['wall_s']:.1f} | {row.get('speedup', float('nan')):.2f} | "
              f"{row['winners']} | {row['candidate_rows']} | {row['crashes']} |")
    print(f"\n{len(failures)} checks failed" if failures else "\nevery check passed")
    sys.exit(1 if failures else 0)


def plot(out, gpus):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    samples = {}
    runs = {}
    with open(os.path.join(out, "utilisation.csv")) as f:
        for row in csv.DictReader(f):
            t, gpu = float(row["t_s"]), int(row["gpu"])
            samples.setdefault(gpu, ([], []))
            samples[gpu][0].append(t)
            samples[gpu][1].append(float(row["util_pct"]))
            if row["run"] != "idle":
                first, last = runs.get(row["run"], (t, t))
                runs[row["run"]] = (min(first, t), max(last, t))
    fig, axes = plt.subplots(gpus, 1, figsize=(11, 1.8 * gpus + 0.6), sharex=True)
    for gpu, ax in enumerate(axes):
        ts, util = samples.get(gpu, ([], []))
        ax.fill_between(ts, util, step="post", alpha=0.6)
        ax.set_ylabel(f"GPU {gpu} %")
        ax.set_ylim(0, 105)
        for name, (first, last) in runs.items():
            ax.axvspan(first, last, alpha=0.08, color="gray")
            if gpu == 0:
                ax.text((first + last) / 2, 100, name, ha="center", va="top", fontsize=8)
    axes[-1].set_xlabel("seconds")
    fig.suptitle("flashgen tune: GPU utilisation per run (nvidia-smi, 200 ms)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "utilisation.png"), dpi=110)


if __name__ == "__main__":
    main()
