#!/usr/bin/env bash
# compute-sanitizer racecheck and synccheck on the sm90 backward's dkdv kernel, on a Hopper GPU, with the SASS
# around the offsets racecheck names. Tests what racecheck pairs the LSE and D bulk copies with (a stage's
# earlier loads, whose order comes from the empty barriers; see templates/bwd_sm90.cuh):
#   ring      bwd_sm90_fp16_d128_m64_n128_s2_causal at 256 keys (the ring of 2 stages wraps), at 128 (it
#             does not), with 3 stages, and bwd_sm90_fp16_d64_m128_n128_s2 at 512 (wraps; at 256 it did not);
#   variants  the templates as they are, with every consumer thread arriving on the empty barriers
#             (all_arrive), and without the deterministic strategy's __syncwarp (no_syncwarp), through
#             FLASHGEN_TEMPLATE_DIR;
#   hazards   one run in racecheck's hazard mode: WAR or RAW, the writing and reading threads.
# If racecheck merely fails to follow the empty barriers to a raw cp.async.bulk, every run whose ring wraps
# reports the bulk copies (UBLKCP) against the LSE and D loads (LDS) of the stage's earlier use, the
# all_arrive and no_syncwarp variants alike, the hazards are WAR with readers in every lane, and the run whose
# ring does not wrap is clean. At 256 keys the LSE reads named are the masked branch's (query blocks 0 and 1,
# the stages' first use), not the unmasked branch's that follow the copies.
# Usage, from the checkout's root, with build/ built on the development machine and carried:
#   scripts/racecheck_bwd_sm90.sh [OUT_DIR]     (default $OUT, else ./racecheck_out)
# Writes summary.txt (the table to read), racecheck.txt (every sanitizer log) and sass.txt to OUT_DIR.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FLASHGEN_BUILD_DIR:-$root/build}
out=${1:-${OUT:-$root/racecheck_out}}
cuda=${CUDA_HOME:-/usr/local/cuda}
cs=$(command -v compute-sanitizer || echo "$cuda/bin/compute-sanitizer")
nvdisasm=$(command -v nvdisasm || echo "$cuda/bin/nvdisasm")
mkdir -p "$out"
[ -x "$build/flashgen" ] || { echo "no $build/flashgen: build it first (cmake --build build --target flashgen_cli)" >&2; exit 2; }
export LD_LIBRARY_PATH=$build:$cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
work=$(mktemp -d)
export FLASHGEN_CACHE_DIR=$work/cache FLASHGEN_TUNING_DB=$work/empty.sqlite
export FLASHGEN_NVRTC_LINEINFO=1  # source lines in the logs; the SASS is the same as without
summary=$out/summary.txt logs=$out/racecheck.txt
: > "$summary"; : > "$logs"

# Template variants: copies of templates/ with bwd_sm90.cuh edited; each edit must match exactly once.
variant() {  # name, then python replacements old=>new separated by '|||'
  local dir=$work/templates_$1
  mkdir -p "$dir" && cp "$root"/templates/*.cuh "$dir"/
  python3 - "$dir/bwd_sm90.cuh" "$2" <<'PY' || exit 1
import sys
path, edits = sys.argv[1], sys.argv[2]
text = open(path).read()
for edit in edits.split('|||'):
    old, new, count = edit.split('=>') + ['1'] if edit.count('=>') == 1 else edit.split('=>')
    assert text.count(old) == int(count), f"{path}: {old!r} found {text.count(old)} times, not {count}"
    text = text.replace(old, new)
open(path, 'w').write(text)
PY
  echo "$dir"
}
all_arrive=$(variant all_arrive \
  "mbarrier_init(bars.empty(s), kConsumers * 4)=>mbarrier_init(bars.empty(s), kConsumers * 128)|||if (lane == 0) sm90::mbarrier_arrive(bars.empty(s));=>sm90::mbarrier_arrive(bars.empty(s));=>2") || exit 1
no_syncwarp=$(variant no_syncwarp "        __syncwarp();
        if (lane == 0) sm90::mbarrier_arrive(bars.empty(s));=>        if (lane == 0) sm90::mbarrier_arrive(bars.empty(s));") || exit 1

d128=bwd_sm90_fp16_d128_m64_n128_s2_causal
det=bwd_sm90_fp16_d128_m64_n128_s2_causal_det_qm64_qn64_qw4_qs2
# label | tool | template dir (- for the checkout's) | config | seqlen | head_dim | mask | extra run flags
runs=(
  "ring-wraps|racecheck|-|$d128|256|128|bottom-right|"
  "ring-does-not-wrap|racecheck|-|$d128|128|128|bottom-right|"
  "3-stages|racecheck|-|bwd_sm90_fp16_d128_m64_n128_s3_causal|256|128|bottom-right|"
  "d64-ring-wraps|racecheck|-|bwd_sm90_fp16_d64_m128_n128_s2|512|64|none|"
  "all-arrive|racecheck|$all_arrive|$d128|256|128|bottom-right|"
  "det|racecheck|-|$det|256|128|bottom-right|--deterministic"
  "det-no-syncwarp|racecheck|$no_syncwarp|$det|256|128|bottom-right|--deterministic"
  "sync|synccheck|-|$d128|256|128|bottom-right|"
  "sync-det|synccheck|-|$det|256|128|bottom-right|--deterministic"
  "hazards|racecheck-hazard|-|$d128|256|128|bottom-right|"
)
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$cs" --version | tail -1
  printf '%-20s %-16s %-6s %-52s %-6s %s\n' label tool rc config seqlen "summary | check | write offsets ; read offsets"
} >> "$summary"
for spec in "${runs[@]}"; do
  IFS='|' read -r label tool tdir cfg seqlen hd mask extra <<< "$spec"
  opts=(--tool "${tool%-hazard}" --error-exitcode 9)
  [ "$tool" = racecheck-hazard ] && opts+=(--racecheck-report hazard)
  log=$work/$label.log
  # shellcheck disable=SC2086
  (if [ "$tdir" != - ]; then export FLASHGEN_TEMPLATE_DIR=$tdir; fi
   timeout 120 "$cs" "${opts[@]}" "$build/flashgen" run --backward --config "$cfg" $extra --batch 1 --heads-q 2 --heads-kv 2 \
     --seqlen-q "$seqlen" --seqlen-k "$seqlen" --head-dim "$hd" --dtype fp16 --causal "$mask" --iters 1 --warmup 0 \
     --check-rows 8) > "$log" 2>&1
  rc=$?
  # Hazard mode prints every hazard: the summary below counts them all, the log keeps the first 400 lines.
  { echo "######## $label: $tool, ${tdir##*/}, $cfg, seqlen $seqlen (rc $rc, $(wc -l < "$log") lines)"; head -n 400 "$log"; } >> "$logs"
  python3 - "$log" "$label" "$tool" "$rc" "$cfg" "$seqlen" >> "$summary" <<'PY'
import re, sys, collections
log, label, tool, rc, cfg, seqlen = sys.argv[1:]
text = open(log, errors='replace').read()
summ = re.findall(r'(?:RACECHECK|ERROR) SUMMARY: [^\n]*', text)
check = re.search(r'check:.*?(PASS|FAIL)', text)
def offset(token):  # "symbol+0x5fc0" or "0x00005fc0": the kernel offset, as racecheck's analysis report gives it
    found = re.findall(r'0x[0-9a-f]+', token)
    return hex(int(found[-1], 16)) if found else token
writes = sorted({offset(t) for t in re.findall(r'Write access at (\S+)', text)}, key=lambda x: int(x, 16))
reads = sorted({offset(t) for t in re.findall(r'Read access at (\S+)', text)}, key=lambda x: int(x, 16))
print(f"{label:20} {tool:16} {rc:6} {cfg[:52]:52} {seqlen:6} {summ[-1] if summ else '-'} | "
      f"{check.group(1) if check else 'no check'} | {' '.join(writes) or '-'} ; {' '.join(reads) or '-'}")
if tool == 'racecheck-hazard':
    # Each hazard: its kind, then the two threads and the offsets of their accesses.
    kinds = collections.Counter(); writers = collections.Counter(); reader_lanes = collections.Counter()
    reader_warps = collections.Counter(); pairs = collections.Counter()
    for block in re.split(r'Potential ', text)[1:]:
        kind = block.split()[0]
        acc = [(rw, tid, offset(at)) for rw, tid, at in
               re.findall(r'(Read|Write) Thread \((\d+),\s*\d+,\s*\d+\) at (\S+)', block)]
        kinds[kind] += 1
        for rw, tid, off in acc:
            if rw == 'Write': writers[(int(tid), off)] += 1
            else: reader_lanes[int(tid) % 32] += 1; reader_warps[int(tid) // 32] += 1
        pairs[(kind, tuple(sorted(off for _, _, off in acc)))] += 1
    print(f"    hazard kinds {dict(kinds)}; writers (thread, offset) {dict(writers)}")
    print(f"    reading warps {dict(sorted(reader_warps.items()))}; reading lanes {dict(sorted(reader_lanes.items()))}")
    for (kind, offs), n in sorted(pairs.items())[:24]: print(f"    {kind} {' '.join(offs)}: {n}")
PY
done

# SASS of the dkdv kernel (the cubin the first run loaded, from the cache): the instructions at the offsets
# racecheck named, with source lines, and every barrier, bulk copy and shared load in order.
"$build/flashgen" compile "$d128" --arch 90 --cubin-dir "$work/cubin" > /dev/null 2>&1
cubin=$work/cubin/$d128.sm_90a.cubin
{
  if [ -x "$nvdisasm" ]; then "$nvdisasm" -gi "$cubin" 2>/dev/null || "$nvdisasm" -g "$cubin"
  else "$cuda/bin/cuobjdump" -sass "$cubin"; fi
} > "$work/sass_all.txt" 2>&1
python3 - "$work/sass_all.txt" "${d128}_dkdv" "$work/ring-wraps.log" > "$out/sass.txt" <<'PY'
import re, sys
sass, symbol, log = sys.argv[1:]
lines = open(sass, errors='replace').read().splitlines()
inside = False; rows = []; where = ''
for l in lines:
    if re.match(r'\s*\.(text|section)\.?', l) or re.match(r'^\S+:\s*$', l) or 'Function :' in l:
        if symbol in l and ('.text.' in l or 'Function :' in l): inside = True
        elif ('.text.' in l or 'Function :' in l) and symbol not in l: inside = False
    if not inside: continue
    if '//##' in l: where = l.strip().lstrip('/#').strip(); continue
    m = re.search(r'/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;?\s*(?:/\*.*)?$', l)
    if m: rows.append((int(m.group(1), 16), m.group(2).strip(), where))
text = open(log, errors='replace').read()
targets = sorted({int(re.findall(r'0x[0-9a-f]+', t)[-1], 16) for t in re.findall(r'access at (\S*0x[0-9a-f]+)', text)}) or \
          [0x5fc0, 0x6060, 0x22a0, 0x2e00, 0x2fe0]
print(f"{symbol}: {len(rows)} instructions")
print("== instructions at the offsets racecheck named (ring-wraps run), 3 either side")
for t in targets:
    print(f"-- +{t:#x}")
    for a, ins, w in rows:
        if abs(a - t) <= 0x30: print(f"{'>>' if a == t else '  '} {a:#06x}  {ins:60}  {w}")
print("== barriers, mbarrier operations, bulk copies, TMA and shared loads, in code order")
for a, ins, w in rows:
    words = ins.split()
    op = words[1] if len(words) > 1 and words[0].startswith('@') else (words[0] if words else '')
    if re.match(r'(BAR|SYNCS|UBLKCP|UTMA|LDS|WARPSYNC|FENCE|MEMBAR|EXIT)\b', op):
        print(f"   {a:#06x}  {ins:60}  {w}")
PY
cat "$summary"
rm -rf "$work"
