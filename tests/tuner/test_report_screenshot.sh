#!/usr/bin/env bash
# `flashgen db report`'s page as a browser draws it: a small sweep on two GPUs is imported, reported and rendered by
# headless Chromium (Debian's `chromium`), and the screenshot must show the charts: the winners' orange diamonds and
# the candidates' blue dots, on a page that is not blank. Exits 77 (skipped) without chromium or python3.
# Usage: test_report_screenshot.sh FLASHGEN_CLI WORK_DIR
set -euo pipefail
cli=$1
work=$2
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $browser ]] || ! command -v python3 >/dev/null; then
  echo "skipped: needs chromium and python3"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
export FLASHGEN_CACHE_DIR=$work/cache

# An export of one forward problem swept on two GPUs: 13 sm80 configs with times from a simple model, one that
# failed to compile; each GPU's fastest is its winner.
python3 - "$work/sweep.json" <<'EOF'
import json, sys
problem = {"id": "fwd|fp16|d128|causal|g1|q4096|k4096|bh64", "family": "fwd", "dtype": "fp16", "head_dim": 128,
           "mask": "causal", "gqa_ratio": 1, "seqlen_q_bucket": 4096, "seqlen_k_bucket": 4096, "batch_heads_bucket": 64}
devices = [("NVIDIA A100-SXM4-80GB", 80, 108, 1.0), ("NVIDIA H100 80GB HBM3", 90, 132, 0.62)]
doc = {"format": "flashgen-tuning", "version": 1, "devices": [], "problems": [problem], "candidates": [], "winners": []}
configs = [(m, n, w, s) for m, w in ((128, 4), (128, 8), (64, 4)) for n in (32, 64, 128) for s in (2, 3)
           if not (m == 64 and n == 128)]
for name, sm, sms, scale in devices:
    device_id = f"{name}|sm{sm}|{sms}sm|drv13000|nvrtc13.0|gen2"
    doc["devices"].append({"id": device_id, "gpu_name": name, "sm": sm, "sm_count": sms, "driver_version": 13000,
                           "nvrtc_version": "13.0", "generator_version": "2"})
    best = None
    for i, (m, n, w, s) in enumerate(configs):
        config = {"family": "fwd_sm80", "dtype": "fp16", "head_dim": 128, "mask": "causal", "block_m": m,
                  "block_n": n, "warps": w, "stages": s, "q_in_regs": False}
        config_name = f"fwd_sm80_fp16_d128_m{m}_n{n}_w{w}_s{s}_causal"
        failed = (m, n, w, s) == (128, 128, 8, 3)
        ms = scale * 0.9 * (1 + abs(n - 64) / 96) * (1.25 if m == 64 else 1) * (1.1 if w == 8 else 1) * (1 + 0.04 * (s - 2))
        doc["candidates"].append({"device_id": device_id, "problem_id": problem["id"], "config_name": config_name,
                                  "config": config, "status": "compile_error" if failed else "ok",
                                  "median_ms": 0 if failed else ms, "spread": 0 if failed else 0.01,
                                  "samples": 0 if failed else 30, "detail": "ptxas: out of resources" if failed else "",
                                  "updated_at": 1764300000})
        if not failed and (best is None or ms < best[1]):
            best = (config_name, ms, config)
    doc["winners"].append({"device_id": device_id, "problem_id": problem["id"], "config_name": best[0],
                           "config": best[2], "median_ms": best[1], "updated_at": 1764300000})
json.dump(doc, open(sys.argv[1], "w"))
EOF
"$cli" db import "$work/sweep.json" --db "$work/tuning.sqlite" >/dev/null
"$cli" db report --db "$work/tuning.sqlite" --html "$work/report.html" >/dev/null

profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
  --disable-sync --no-first-run --hide-scrollbars --user-data-dir="$profile" --window-size=1400,1400 \
  --screenshot="$work/report.png" "file://$work/report.html" >/dev/null 2>&1
[[ -s $work/report.png ]] || { echo "no screenshot"; exit 1; }

# Decodes the PNG (8-bit RGB or RGBA, as Chromium writes it) and counts what the charts draw.
python3 - "$work/report.png" <<'EOF'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat = 8, b""
while pos < len(data):
    size, = struct.unpack(">I", data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + size]
    pos += 12 + size
    if kind == b"IHDR":
        width, height, depth, color = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT":
        idat += body
assert depth == 8 and color in (2, 6), f"unexpected PNG format: depth {depth}, color type {color}"
raw, bpp = zlib.decompress(idat), 3 if color == 2 else 4
stride = width * bpp
prev = bytearray(stride)
orange = blue = ink = 0
for y in range(height):
    kind = raw[y * (stride + 1)]
    row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if kind == 1:
        for i in range(bpp, stride): row[i] = (row[i] + row[i - bpp]) & 255
    elif kind == 2:
        row = bytearray((a + b) & 255 for a, b in zip(row, prev))
    elif kind == 3:
        for i in range(stride): row[i] = (row[i] + ((row[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
    elif kind == 4:
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    prev = row
    for x in range(0, stride, bpp):
        r, g, b = row[x], row[x + 1], row[x + 2]
        if r < 235 or g < 235 or b < 235: ink += 1
        if abs(r - 0xe4) < 12 and abs(g - 0x57) < 12 and abs(b - 0x2e) < 12: orange += 1  # a winner's diamond
        if b > r + 30 and b > 150 and 120 < g < 200 and r > 100: blue += 1                # a candidate's dot
print(f"{width}x{height}: {ink} inked pixels, {orange} winner orange, {blue} candidate blue")
assert ink > width * height // 50, "the page is blank"
assert orange >= 100, "no winner marks drawn"
assert blue >= 500, "no candidate marks drawn"
EOF
