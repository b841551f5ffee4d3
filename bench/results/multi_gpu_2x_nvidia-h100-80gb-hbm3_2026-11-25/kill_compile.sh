#!/bin/bash
# A tune --devices worker killed while it compiles (before any candidate runs) is restarted and loses nothing.
set -u
cd build && ln -sf libflashgen.so.0.1.0 libflashgen.so.0.1 && ln -sf libflashgen.so.0.1 libflashgen.so && cd ..
export LD_LIBRARY_PATH=$PWD/build:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
cat > /tmp/s.json <<'J'
{"max_candidates": 4, "problems": [
 {"pass": "backward", "dtype": "bf16", "head_dim": 128, "batch": 4, "heads_q": 16, "heads_kv": 16, "seqlen_q": 4096, "seqlen_k": 4096, "causal": "bottom-right"},
 {"pass": "backward", "dtype": "fp16", "head_dim": 128, "batch": 4, "heads_q": 16, "heads_kv": 16, "seqlen_q": 4096, "seqlen_k": 4096, "causal": "none"},
 {"pass": "forward", "dtype": "bf16", "head_dim": 128, "batch": 4, "heads_q": 16, "heads_kv": 16, "seqlen_q": 4096, "seqlen_k": 4096, "causal": "none"},
 {"pass": "forward", "dtype": "fp16", "head_dim": 64, "batch": 4, "heads_q": 32, "heads_kv": 32, "seqlen_q": 4096, "seqlen_k": 4096, "causal": "none"}]}
J
DB=/tmp/k.sqlite
FLASHGEN_CACHE_DIR=/tmp/cold build/flashgen tune --spec /tmp/s.json --devices all --db $DB --json > $OUT/kill_compile.json 2> $OUT/kill_compile.log &
SUP=$!
for i in $(seq 1 100); do pgrep -f -- "--shard 1/2 --db" > /dev/null && break; sleep 0.05; done
sleep 0.5
J1=$DB.workers/gpu1.journal
echo "journal of worker 1 before the kill: '$(cat $J1)' ($(stat -c %s $J1) bytes)"
pkill -9 -f -- "--shard 1/2 --db" && echo "killed worker 1 while it compiled"
wait $SUP; echo "supervisor rc=$?"
cat $OUT/kill_compile.json
grep -n "restarting\|worker\|space:" $OUT/kill_compile.log | cut -c1-400 | head -20
python3 - <<'P'
import sqlite3
db = sqlite3.connect("/tmp/k.sqlite")
print("winners", db.execute("select count(*) from winners").fetchone()[0],
      "candidates", db.execute("select count(*) from candidates").fetchone()[0],
      "by status", db.execute("select status, count(*) from candidates group by status").fetchall())
P
