#!/usr/bin/env python3
"""Proves a template or generator refactor leaves the kernels alone: emits each config's self-contained
source from a BEFORE and an AFTER tree (`flashgen emit`), compiles both to PTX with nvcc, and diffs them.

A side is a flashgen CLI binary and, optionally, a template folder it reads instead of its embedded
templates (FLASHGEN_TEMPLATE_DIR): --before build-before/flashgen:/tmp/templates_before. Keep a CLI built
from the old tree: the generator renders part of the source (the config header).

Configs (name and arch, sm_80 or sm_90a):
  --set quick   every kernel family x dtype x head_dim x mask x each knob value, about 80 configs
  --set full    every entry of the built-in lists (heuristic_forward_configs, heuristic_backward_configs,
                default_forward_candidates; scripts/list_kernel_configs.cpp, built against --lister-build),
                every winner of tuner/data/*.json, the golden files' configs and the quick set
  --set FILE    lines "<config-name> <arch>"
Identical PTX means identical SASS (same ptxas). For configs whose PTX differs, --resources runs
`ptxas -v` on both sides and compares registers, spills, stack and warnings (e.g. C7515, serialized wgmma),
and whether the two cubins are byte-identical (PTX that differs only in the order of independent
instructions often assembles to the same machine code).

  scripts/compare_kernels.py --before build-before/flashgen:/tmp/templates_before \\
      --after build-tpl/flashgen --set quick --out /tmp/cmp --resources

PTX is kept per side under --out/<side>/: --reuse-before keeps the old tree's (one old tree, many new
ones), --only before|after builds one side alone (ahead of time, or both sides at once). Exit status 0
when every config is identical, 1 otherwise; the report is --out/report.txt.
"""
import argparse
import concurrent.futures
import difflib
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every family x dtype x a spread of head_dims x mask x each knob value at least once.
QUICK = """
fwd_sm80_fp16_d128_m128_n32_w4_s3 80
fwd_sm80_bf16_d128_m128_n32_w4_s3_causal 80
fwd_sm80_fp16_d64_m128_n64_w4_s3_qreg 80
fwd_sm80_bf16_d64_m128_n64_w4_s3_causal_qreg 80
fwd_sm80_fp16_d32_m128_n64_w4_s3_causal_qreg 80
fwd_sm80_fp16_d96_m128_n32_w4_s2_causal 80
fwd_sm80_bf16_d96_m64_n64_w4_s2 80
fwd_sm80_fp16_d192_m128_n64_w8_s2_causal 80
fwd_sm80_bf16_d192_m128_n32_w8_s2 80
fwd_sm80_fp16_d256_m128_n48_w8_s2_causal 90
fwd_sm80_bf16_d256_m64_n32_w4_s2 80
fwd_sm80_fp16_d40_m64_n64_w4_s2_causal 80
fwd_sm80_fp16_d72_m64_n32_w4_s4 80
fwd_sm80_fp16_d128_m128_n64_w8_s2_causal 90
fwd_sm80_bf16_d160_m128_n32_w8_s2_causal 90
fwd_sm80_fp16_d128_m16_n16_w1_s2_causal 80
fwd_sm90_bf16_d96_m128_n128_s2_ovl_pp_pst 90
fwd_sm90_fp16_d128_m128_n128_s2_ovl_pp_pst 90
fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pp_pst 90
fwd_sm90_fp16_d128_m128_n128_s2_causal_ovl_pp 90
fwd_sm90_fp16_d128_m128_n128_s2_causal 90
fwd_sm90_bf16_d128_m128_n128_s2 90
fwd_sm90_fp16_d128_m128_n96_s2_causal_ovl_pp_pst 90
fwd_sm90_fp16_d128_m128_n64_s2_causal_pst 90
fwd_sm90_bf16_d128_m128_n128_s2_causal_ovl_pst_psm 90
fwd_sm90_fp16_d128_m128_n128_s2_ovl_psm 90
fwd_sm90_fp16_d128_m128_n128_s2_causal_pp_psm 90
fwd_sm90_fp16_d128_m128_n128_s2_ovl_psm_c2 90
fwd_sm90_bf16_d128_m128_n128_s2_ovl_pp_pst_c2 90
fwd_sm90_fp16_d128_m128_n128_s2_c2 90
fwd_sm90_fp16_d128_m128_n128_s3_causal_ovl 90
fwd_sm90_fp16_d64_m64_n128_s4_causal_ovl 90
fwd_sm90_fp16_d128_m64_n128_s2 90
fwd_sm90_fp16_d64_m256_n64_s3_ovl_pst_tsum 90
fwd_sm90_bf16_d64_m256_n64_s3_ovl_pst 90
fwd_sm90_fp16_d64_m128_n64_s3_causal_ovl_pst_g2_tsum 90
fwd_sm90_bf16_d64_m128_n64_s3_causal_ovl_pst_g2 90
fwd_sm90_fp16_d64_m128_n64_s3_ovl_pst_g2 90
fwd_sm90_fp16_d64_m192_n128_s2_causal_ovl_pst_tsum 90
fwd_sm90_fp16_d64_m192_n128_s2_ovl_pst 90
fwd_sm90_fp16_d64_m128_n64_s2_causal_tsum 90
fwd_sm90_fp16_d64_m128_n64_s2_causal_ovl_pp_psm_tsum 90
fwd_sm90_fp16_d64_m64_n192_s2_causal_ovl 90
fwd_sm90_bf16_d192_m128_n112_s2_causal_ovl_pp_pst 90
fwd_sm90_fp16_d192_m128_n112_s2_ovl_pp_pst 90
fwd_sm90_fp16_d192_m128_n96_s2_causal_ovl_pp_pst 90
fwd_sm90_bf16_d192_m128_n64_s2_causal 90
fwd_sm90_fp16_d256_m128_n64_s2_causal_ovl_pp_pst 90
fwd_sm90_bf16_d256_m128_n64_s2_ovl_pp_pst 90
fwd_sm90_fp16_d256_m128_n80_s2_causal_ovl_pp_pst 90
fwd_sm90_fp16_d256_m64_n64_s2_causal 90
fwd_sm90_bf16_d256_m64_n64_s2_pst 90
bwd_sm80_bf16_d128_m64_n64_w4_s2_x1_causal 80
bwd_sm80_fp16_d128_m64_n128_w8_s2_x1 90
bwd_sm80_fp16_d128_m32_n128_w8_s2_x1_causal 80
bwd_sm80_bf16_d128_m64_n64_w4_s2_x1_det_qm64_qn32_qw4_qs2 80
bwd_sm80_fp16_d128_m64_n64_w4_s2_x1_causal_det_qm64_qn32_qw4_qs2 80
bwd_sm80_fp16_d64_m64_n128_w8_s2_x1_causal 80
bwd_sm80_bf16_d64_m64_n64_w4_s2_x1_causal_det_qm64_qn64_qw4_qs2 80
bwd_sm80_fp16_d96_m32_n128_w8_s2_x1_causal 80
bwd_sm80_fp16_d192_m32_n128_w8_s2_x2_causal 90
bwd_sm80_bf16_d256_m32_n64_w4_s2_x2_causal_det_qm64_qn16_qw4_qs2 80
bwd_sm80_fp16_d256_m16_n64_w4_s2_x2 80
bwd_sm80_fp16_d40_m16_n32_w2_s2_x1_causal 80
bwd_sm80_fp16_d128_m64_n64_w4_s3_x1_causal 80
bwd_sm80_fp16_d128_m64_n128_w8_s2_x1_causal 90
bwd_sm90_fp16_d128_m64_n128_s2_causal 90
bwd_sm90_bf16_d128_m64_n128_s2 90
bwd_sm90_fp16_d64_m128_n128_s2_causal 90
bwd_sm90_bf16_d64_m128_n128_s2 90
bwd_sm90_fp16_d128_m64_n128_s2_causal_det 90
bwd_sm90_bf16_d64_m128_n128_s2_det 90
bwd_sm90_fp16_d64_m64_n64_s3_causal 90
bwd_sm90_fp16_d64_m64_n64_s2 90
bwd_sm90_fp16_d96_m64_n128_s2_causal_det 90
"""


def golden_configs():
    jobs = []
    for path in glob.glob(os.path.join(ROOT, "tests/generator/golden/*")):
        name = re.sub(r"(_config\.cuh|\.cu)$", "", os.path.basename(path))
        jobs.append((name, 90 if "_sm90_" in name else 80))
    return jobs


def shipped_winners():
    jobs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tuner/data/*.json"))):
        with open(path) as f:
            data = json.load(f)
        sm = data["devices"][0]["sm"] if data.get("devices") else 90
        for winner in data.get("winners", []):
            jobs.append((winner["config_name"], sm))
    return jobs


def heuristic_configs(build):
    exe = os.path.join(build, "list_kernel_configs")
    subprocess.run(["c++", "-std=c++17", "-O1", "-I" + ROOT, "-I" + os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "scripts/list_kernel_configs.cpp"), "-L" + build, "-lflashgen",
                    "-Wl,-rpath," + os.path.abspath(build), "-o", exe], check=True)
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return [(line.split()[0], int(line.split()[1])) for line in out.splitlines() if line.strip()]


def parse_jobs(text):
    return [(line.split()[0], int(line.split()[1])) for line in text.splitlines() if line.strip()]


def collect(args):
    if args.set == "quick":
        jobs = parse_jobs(QUICK) + golden_configs()
    elif args.set == "full":
        jobs = heuristic_configs(args.lister_build) + shipped_winners() + golden_configs() + parse_jobs(QUICK)
    else:
        with open(args.set) as f:
            jobs = parse_jobs(f.read())
    seen, unique = set(), []
    for job in jobs:
        if job not in seen:
            seen.add(job)
            unique.append(job)
    return unique


def target(arch):
    return "sm_90a" if arch == 90 else "sm_%d" % arch


def normalized_ptx(text):
    # Comments (the compiler's banner) and debug locations say nothing about the code.
    keep = [line for line in text.splitlines() if not re.match(r"\s*(//|\.loc\b|\.file\b)", line) and line.strip()]
    return "\n".join(keep) + "\n"


def build_ptx(side, job, out_dir, nvcc, reuse):
    name, arch = job
    cli, templates = side
    stem = os.path.join(out_dir, "%s.%s" % (name, target(arch)))
    if reuse and os.path.exists(stem + ".ptx"):
        return stem + ".ptx", None
    env = dict(os.environ)
    if templates:
        env["FLASHGEN_TEMPLATE_DIR"] = templates
    else:
        env.pop("FLASHGEN_TEMPLATE_DIR", None)
    emit = subprocess.run([cli, "emit", name, "--arch", str(arch), "-o", stem + ".cu"], env=env,
                          capture_output=True, text=True)
    if emit.returncode != 0:
        return None, "emit failed: " + (emit.stdout + emit.stderr).strip().splitlines()[-1]
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    compile_ = subprocess.run([nvcc, "-arch=" + target(arch), "-ptx", "-std=c++17", "-I" + cuda_home + "/include",
                               stem + ".cu", "-o", stem + ".raw.ptx"], capture_output=True, text=True)
    if compile_.returncode != 0:
        return None, "nvcc failed: " + (compile_.stdout + compile_.stderr).strip()[:2000]
    with open(stem + ".raw.ptx") as f:
        text = normalized_ptx(f.read())
    with open(stem + ".ptx", "w") as f:
        f.write(text)
    os.remove(stem + ".raw.ptx")
    return stem + ".ptx", None


def ptxas_report(ptx, arch):
    """Registers, spills and stack of each entry, ptxas's warnings, and the cubin (next to the PTX)."""
    cubin = ptx[:-len(".ptx")] + ".cubin"
    run = subprocess.run(["ptxas", "-arch=" + target(arch), "-v", ptx, "-o", cubin], capture_output=True,
                         text=True)
    text = run.stdout + run.stderr
    entries, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            entries[current] = {}
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            entries[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            entries[current]["registers"] = int(m.group(1))
    warnings = sorted(set(re.sub(r"'[^']*'", "'…'", l.strip()) for l in text.splitlines() if "warning" in l.lower()))
    return {"entries": entries, "warnings": warnings, "ok": run.returncode == 0}, cubin


def parse_side(text):
    cli, _, templates = text.partition(":")
    return os.path.abspath(cli), os.path.abspath(templates) if templates else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="CLI[:TEMPLATE_DIR] of the old tree")
    parser.add_argument("--after", help="CLI[:TEMPLATE_DIR] of the new tree")
    parser.add_argument("--set", default="quick", help="quick, full or a file of '<name> <arch>' lines")
    parser.add_argument("--lister-build", default=os.path.join(ROOT, "build"),
                        help="build folder whose libflashgen lists the built-in configs (--set full)")
    parser.add_argument("--out", default="/tmp/flashgen_compare")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--nvcc", default="nvcc")
    parser.add_argument("--reuse-before", action="store_true", help="keep PTX already under --out/before")
    parser.add_argument("--reuse-after", action="store_true",
                        help="keep PTX already under --out/after (only while the new tree has not changed since)")
    parser.add_argument("--resources", action="store_true", help="ptxas -v both sides of each config that differs")
    parser.add_argument("--shard", metavar="K/N", help="only configs K, K + N, K + 2N, ... of the list (0 <= K < N)")
    parser.add_argument("--list", action="store_true", help="print the configs and stop")
    parser.add_argument("--only", choices=["before", "after"],
                        help="build one side's PTX and stop (to reuse with --reuse-before or --reuse-after)")
    args = parser.parse_args()

    jobs = collect(args)
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        jobs = jobs[k::n]
    if args.list:
        for name, arch in jobs:
            print(name, arch)
        return 0
    for side in ("before", "after"):
        if args.only in (None, side) and getattr(args, side) is None:
            parser.error("--%s is needed" % side)
    sides = {}
    if args.only != "after":
        sides["before"] = parse_side(args.before)
    if args.only != "before":
        sides["after"] = parse_side(args.after)
    for side in sides:
        os.makedirs(os.path.join(args.out, side), exist_ok=True)

    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {}
        for job in jobs:
            for side, spec in sides.items():
                reuse = args.reuse_before if side == "before" else args.reuse_after
                futures[pool.submit(build_ptx, spec, job, os.path.join(args.out, side), args.nvcc, reuse)] = (job, side)
        done = 0
        for future in concurrent.futures.as_completed(futures):
            job, side = futures[future]
            results[(job, side)] = future.result()
            done += 1
            if done % 50 == 0:
                print("  %d of %d compiled" % (done, len(futures)), file=sys.stderr, flush=True)
    if args.only:
        errors = [(job, error) for (job, _), (_, error) in results.items() if error]
        for (name, arch), error in errors:
            print("FAILED %s %s: %s" % (name, target(arch), error))
        return 1 if errors else 0

    identical, different, failed = [], [], []
    for job in jobs:
        (before, before_error), (after, after_error) = results[(job, "before")], results[(job, "after")]
        if before_error or after_error:
            failed.append((job, before_error or "", after_error or ""))
            continue
        with open(before) as f:
            a = f.read().splitlines()
        with open(after) as f:
            b = f.read().splitlines()
        if a == b:
            identical.append(job)
        else:
            changed = sum(1 for line in difflib.unified_diff(a, b, lineterm="", n=0)
                          if line[:1] in "+-" and line[:3] not in ("+++", "---"))
            different.append((job, changed, before, after))

    lines = ["%d configs: %d identical PTX, %d different, %d failed" % (len(jobs), len(identical), len(different),
                                                                         len(failed))]
    for (name, arch), changed, before, after in different:
        lines.append("DIFFERENT %s %s: %d changed lines (diff %s %s)" % (name, target(arch), changed, before, after))
        if args.resources:
            (a, a_cubin), (b, b_cubin) = ptxas_report(before, arch), ptxas_report(after, arch)
            with open(a_cubin, "rb") as f_a, open(b_cubin, "rb") as f_b:
                same_cubin = f_a.read() == f_b.read()
            verdict = "same registers, spills, stack and warnings" if a == b else "RESOURCES CHANGED"
            lines.append("    ptxas: %s; cubin %s" % (verdict, "byte-identical" if same_cubin else "differs"))
            if a != b:
                lines.append("    before: %s" % json.dumps(a))
                lines.append("    after:  %s" % json.dumps(b))
    for (name, arch), before_error, after_error in failed:
        lines.append("FAILED %s %s: before: %s | after: %s" % (name, target(arch), before_error, after_error))
    report = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "report.txt"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, "identical.txt"), "w") as f:
        f.writelines("%s %d\n" % job for job in identical)
    print(report, end="")
    return 0 if not different and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
