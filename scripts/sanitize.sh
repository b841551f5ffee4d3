#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck on one small problem per kernel family and pass, on a
# GPU (sm_90 for the Hopper families): each run is `flashgen run` of an explicit config with its output
# checked against the float64 reference. Sequences are long enough that every shared-memory ring wraps. Then
# memcheck on a few GPU test cases (build/tests/flashgen_tests) that need more than `flashgen run` sets up.
# Usage, from the checkout's root, with the CLI built:
#   scripts/sanitize.sh [OUT_DIR]      (default $OUT, else ./sanitize_out; FLASHGEN_BUILD_DIR, default build;
#                                        SANITIZE_ONLY, a regular expression: only the configs it matches)
# Writes summary.txt (one line per run) and sanitize.txt (every log) to OUT_DIR; exits 1 if any run
# reports an error or fails its check.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FLASHGEN_BUILD_DIR:-$root/build}
out=${1:-${OUT:-$root/sanitize_out}}
cuda=${CUDA_HOME:-/usr/local/cuda}
cs=$(command -v compute-sanitizer || echo "$cuda/bin/compute-sanitizer")
mkdir -p "$out"
[ -x "$build/flashgen" ] || { echo "no $build/flashgen: build the CLI first" >&2; exit 2; }
export LD_LIBRARY_PATH=$build:$cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
work=$(mktemp -d)
export FLASHGEN_CACHE_DIR=$work/cache FLASHGEN_TUNING_DB=$work/empty.sqlite
export FLASHGEN_NVRTC_LINEINFO=1  # source lines in the reports; the SASS is the same as without
summary=$out/summary.txt logs=$out/sanitize.txt
: > "$logs"

# config | head_dim | mask | extra flags, the batch included (the pass and dQ strategy follow from the config)
# [| sizes, in place of the default heads and lengths below]
problems=(
  "fwd_sm80_fp16_d64_m128_n64_w4_s2_causal|64|bottom-right|--batch 1"
  "fwd_sm90_fp16_d128_m128_n128_s2_causal_pst|128|bottom-right|--batch 1"
  "fwd_sm90_fp16_d128_m128_n128_s2_ovl_pp|128|none|--batch 1"
  "bwd_sm80_fp16_d64_m64_n64_w4_s2_x1_causal|64|bottom-right|--batch 1 --backward"
  "bwd_sm80_fp16_d64_m64_n64_w4_s2_x1_causal_det_qm64_qn32_qw4_qs2|64|bottom-right|--batch 1 --backward --deterministic"
  "bwd_sm90_fp16_d128_m64_n128_s2_causal|128|bottom-right|--batch 1 --backward"
  "bwd_sm90_fp16_d128_m64_n128_s2_causal_det|128|bottom-right|--batch 1 --backward --deterministic"
  # enough (batch, head) pairs for the unmasked deterministic walks to rotate (bwd_sm90.cuh, rotated_turns)
  "bwd_sm90_fp16_d128_m64_n128_s2_det|128|none|--batch 2 --backward --deterministic|--heads-q 16 --heads-kv 16 --seqlen-q 512 --seqlen-k 512"
  "bwd_sm90_fp16_d128_m64_n128_s2|128|none|--batch 1 --backward"
  # the query split (two consumers taking whole steps of 64 keys) and the lock-step loop (three stages)
  "bwd_sm90_fp16_d128_m64_n64_s2|128|none|--batch 1 --backward"
  "bwd_sm90_fp16_d128_m64_n64_s2_causal_det|128|bottom-right|--batch 1 --backward --deterministic"
  "bwd_sm90_fp16_d128_m64_n128_s3_causal|128|bottom-right|--batch 1 --backward"
  "bwd_sm90_fp16_d64_m128_n128_s2_det|64|none|--batch 1 --backward --deterministic"
  "bwd_sm90_fp16_d64_m128_n128_s2_causal|64|bottom-right|--batch 1 --backward"
  "bwd_sm90_fp16_d64_m128_n128_s2_causal_varlen_det|64|bottom-right|--backward --deterministic --varlen --batch 3"
  "bwd_sm90_fp16_d96_m64_n128_s2_causal|96|bottom-right|--batch 1 --backward"
  "bwd_sm90_fp16_d128_m64_n128_s2_causal_softcap|128|bottom-right|--batch 1 --backward --softcap 30"
  "fwd_sm90_fp16_d96_m128_n128_s2_causal_ovl_pp_pst|96|bottom-right|--batch 1"
  "fwd_sm90_fp16_d128_m128_n128_s2_causal_ovl_pp_varlen_paged|128|bottom-right|--varlen --batch 3 --page-size 16"
  "fwd_sm90_fp16_d128_m128_n160_s2_ovl_pp_varlen_paged|128|none|--varlen --batch 3 --page-size 256"
  "bwd_sm90_fp16_d128_m64_n128_s2_causal_varlen_det|128|bottom-right|--backward --deterministic --varlen --batch 3"
  "bwd_sm90_fp16_d256_m64_n64_s2_causal|256|bottom-right|--batch 1 --backward"
  "bwd_sm90_fp16_d256_m64_n64_s2_det|256|none|--batch 1 --backward --deterministic"
  "bwd_sm90_fp16_d256_m64_n64_s1_causal_det|256|bottom-right|--batch 1 --backward --deterministic"
  "bwd_sm90_fp16_d192_m64_n64_s2_causal|192|bottom-right|--batch 1 --backward"
  "bwd_sm90_fp16_d192_m64_n64_s3_det|192|none|--batch 1 --backward --deterministic"
  "bwd_sm90_fp16_d192_m64_n64_s2_causal_varlen_det|192|bottom-right|--backward --deterministic --varlen --batch 3"
  # values of a head dim of their own (MLA's prefill): the dK/dV split and the ping-pong tile, and the sm80 family
  "bwd_sm90_fp16_d192_v128_m64_n64_s2_causal|192|bottom-right|--batch 1 --backward --head-dim-v 128"
  "bwd_sm90_fp16_d128_v64_m64_n128_s2_det|128|none|--batch 1 --backward --deterministic --head-dim-v 64"
  "bwd_sm80_fp16_d192_v128_m32_n64_w4_s2_x2_causal|192|bottom-right|--batch 1 --backward --head-dim-v 128"
  # values wider than one consumer's registers: two consumers for each 64 rows, each with half of O's columns
  "fwd_sm90_fp16_d64_v512_m64_n64_s2_causal_ovl_pp_pst_vs2|64|bottom-right|--batch 1 --head-dim-v 512"
  "fwd_sm90_fp16_d128_v320_m64_n48_s2_causal_ovl_pp_vs2_varlen_paged|128|bottom-right|--varlen --batch 3 --page-size 64 --head-dim-v 320"
  # keys of 512: the two consumers' output staged in the Q rows they share
  "fwd_sm90_fp16_d512_m64_n32_s2_causal_ovl_pp_pst_vs2|512|bottom-right|--batch 1"
  # keys of 512 backward: the sm80 family's four column slices of dK and dV, the dq kernel's two of dQ
  "bwd_sm80_fp16_d512_m16_n64_w4_s2_x4_causal|512|bottom-right|--batch 1 --backward|--heads-q 2 --heads-kv 1 --seqlen-q 200 --seqlen-k 150"
  "bwd_sm80_fp16_d512_m16_n64_w4_s2_x4_det_qm32_qn16_qw2_qs2|512|none|--batch 1 --backward --deterministic|--heads-q 2 --heads-kv 1 --seqlen-q 130 --seqlen-k 150"
  # KV-cache decoding: 3 ranges of 6 key blocks over 1040 keys, so a range ends in a partial tile
  "dec_sm80_fp16_d40_r16_n64_w4_s3|40|none|--kv-cache --splits 2 --batch 2|--heads-q 4 --heads-kv 2 --seqlen-q 1 --seqlen-k 1000"
  "dec_sm80_fp16_d128_r16_n64_w4_s3_causal_paged|128|bottom-right|--kv-cache --page-size 16 --splits 3 --batch 2|--heads-q 8 --heads-kv 2 --seqlen-q 2 --seqlen-k 1040"
  # the latent decode (MLA's): 64 heads x 2 tokens (two row blocks), pages of 64, split ranges of odd and even
  # block counts; a small latent of four stages, contiguous
  "dec_sm90_fp16_d576_v512_s2_causal_paged|576|bottom-right|--kv-cache --page-size 64 --splits 3 --batch 2 --head-dim-v 512|--heads-q 64 --heads-kv 1 --seqlen-q 2 --seqlen-k 1088"
  "dec_sm90_fp16_d192_v128_s4|192|none|--kv-cache --splits 2 --batch 2 --head-dim-v 128|--heads-q 32 --heads-kv 2 --seqlen-q 1 --seqlen-k 1000"
)
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$cs" --version | tail -1
  printf '%-66s %-10s %-4s %s\n' config tool rc "sanitizer summary | output check"
} > "$summary"
failed=0
# Appends a run's log to $logs and its line to $summary: report NAME TOOL RC LOG CHECK (CHECK: PASS, FAIL or empty).
report() {
  local name=$1 tool=$2 rc=$3 log=$4 check=$5 sanitizer
  { echo "######## $name: $tool (rc $rc)"; head -n 200 "$log"; } >> "$logs"
  sanitizer=$(grep -Eo '(RACECHECK|ERROR) SUMMARY: [^(]*' "$log" | tail -1)
  printf '%-66s %-10s %-4s %s | %s\n' "${name:0:66}" "$tool" "$rc" "${sanitizer:-no summary}" "${check:-no check}" >> "$summary"
  [ "$rc" = 0 ] && [ "$check" = PASS ] || failed=1
}
for spec in "${problems[@]}"; do
  IFS='|' read -r cfg hd mask extra sizes <<< "$spec"
  sizes=${sizes:---heads-q 2 --heads-kv 2 --seqlen-q 512 --seqlen-k 512}
  [[ -n "${SANITIZE_ONLY:-}" && ! $cfg =~ $SANITIZE_ONLY ]] && continue
  for tool in memcheck racecheck synccheck; do
    log=$work/$cfg.$tool.log
    # shellcheck disable=SC2086
    timeout 240 "$cs" --tool "$tool" --error-exitcode 9 "$build/flashgen" run --config "$cfg" $extra $sizes \
      --head-dim "$hd" --dtype fp16 --causal "$mask" --iters 1 --warmup 0 --check-rows 8 > "$log" 2>&1
    rc=$?
    report "$cfg" "$tool" "$rc" "$log" "$(grep -Eo 'check:.*(PASS|FAIL)' "$log" | grep -Eo 'PASS|FAIL' | tail -1)"
  done
done
# GPU test cases under memcheck, for what `flashgen run` cannot set up: a user's variant whose functions read a
# buffer (both passes ask them for every key of a partial tile, keys past seqlen_k clamped inside it).
test_cases=(
  "a user's document mask matches the float64 reference*"
)
for name in "${test_cases[@]}"; do
  [[ -n "${SANITIZE_ONLY:-}" && ! $name =~ $SANITIZE_ONLY ]] && continue
  log=$work/test.memcheck.log
  timeout 240 "$cs" --tool memcheck --error-exitcode 9 "$build/tests/flashgen_tests" "$name" > "$log" 2>&1
  rc=$?
  report "$name" memcheck "$rc" "$log" "$(grep -q 'All tests passed' "$log" && echo PASS || echo FAIL)"
done
cat "$summary"
rm -rf "$work"
exit $failed
