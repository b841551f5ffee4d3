#!/usr/bin/env bash
# A sweep's compile phase under a real Slurm: starts munge and a one-node Slurm cluster of this machine's CPUs (a
# private configuration, state and logs under a temporary folder; every daemon it started is stopped on exit),
# submits `flashgen compile --spec` as a job array of three tasks with a merge job depending on it, kills one task
# midway and requeues it, and checks each shard's summary, that the rerun compiled nothing the killed run had
# finished, the merge step (the unsharded phase again, finding every kernel cached; tune's dry run listing the same
# candidates) and the filled kernel cache. Needs root (slurmd) and Debian's slurmctld, slurmd, munge and
# slurm-client, installed here when missing where apt-get can; otherwise it exits 77 (skipped).
#   test_compile_phase.sh FLASHGEN_BINARY
set -euo pipefail

flashgen=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
started=$SECONDS
say() { printf '==> %s\n' "$*"; }
skip() { printf 'test_compile_phase.sh: SKIPPED: %s\n' "$*" >&2; exit 77; }

[[ $(id -u) -eq 0 ]] || skip "a private Slurm needs root (slurmd starts job steps as their user)"
tools=(munged munge slurmctld slurmd sbatch squeue scontrol scancel python3)
missing() { for tool in "${tools[@]}"; do command -v "$tool" > /dev/null || return 0; done; return 1; }
if missing; then
  command -v apt-get > /dev/null || skip "munge or Slurm is missing and there is no apt-get to install them"
  say "installing slurmctld slurmd munge slurm-client"
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      slurmctld slurmd munge slurm-client; } > /dev/null 2>&1 || skip "cannot install slurmctld slurmd munge slurm-client"
  missing && skip "still missing one of: ${tools[*]}"
fi

# Whatever scheduler this runs under stays out of the private cluster and its jobs.
while read -r name; do unset "$name"; done < <(compgen -e | grep -E '^(SLURM_|SBATCH_|SRUN_|SQUEUE_|OMPI_)' || true)

work=$(mktemp -d /tmp/flashgen-slurm.XXXXXX)
mkdir -p "$work"/{munge-key,munge-run,state,spool,log,out}
chmod 0700 "$work/munge-key"
chmod 0755 "$work" "$work/munge-run"

# Stops what this script started, by the ids in its pid files, and removes the folder (kept when the test fails).
cleanup() {
  local status=$?
  if [[ -f $work/slurmctld.pid ]]; then scancel --quiet --user="$(id -un)" 2> /dev/null || true; fi
  for daemon in slurmd slurmctld munged; do
    local file=$work/$daemon.pid
    [[ $daemon == munged ]] && file=$work/munge-run/munged.pid
    [[ -s $file ]] || continue
    local pid
    pid=$(< "$file")
    kill "$pid" 2> /dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2> /dev/null || true
  done
  if ((status == 0)); then rm -rf "$work"; else printf 'test_compile_phase.sh: logs kept in %s\n' "$work" >&2; fi
}
trap cleanup EXIT

fail() {
  printf 'test_compile_phase.sh: FAILED: %s\n' "$*" >&2
  squeue --all 2> /dev/null >&2 || true
  for log in "$work"/log/*.log "$work"/out/*.log; do
    [[ -f $log ]] && { printf -- '--- %s\n' "$log" >&2; tail -n 20 "$log" >&2; }
  done
  exit 1
}

# Waits up to $1 seconds for the command after it to succeed.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# A free TCP port on this machine.
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    (exec 3<> "/dev/tcp/127.0.0.1/$port") 2> /dev/null || { echo "$port"; return; }
  done
}

say "munge and a one-node Slurm cluster in $work"
head -c 1024 /dev/urandom > "$work/munge-key/munge.key"
chmod 0400 "$work/munge-key/munge.key"
socket=$work/munge-run/munge.socket
munged --force --socket="$socket" --key-file="$work/munge-key/munge.key" --pid-file="$work/munge-run/munged.pid" \
  --log-file="$work/log/munged.log" --seed-file="$work/munge-run/munged.seed" || fail "munged did not start"
wait_for 10 test -S "$socket" || fail "munged made no socket"

ctld_port=$(free_port)
slurmd_port=$(free_port)
while [[ $slurmd_port == "$ctld_port" ]]; do slurmd_port=$(free_port); done
export SLURM_CONF=$work/slurm.conf
cat > "$SLURM_CONF" << EOF
ClusterName=flashgen-test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" -N localhost || fail "slurmd did not start"
node_idle() { [[ $(sinfo --noheader --nodes=localhost --format=%t 2> /dev/null) == idle ]]; }
wait_for 60 node_idle || fail "the node did not come up idle"

# Three problems of different classes, one per shard; the backward (shard 1) has the most kernels to kill midway.
spec=$work/spec.json
cat > "$spec" << 'EOF'
{"max_candidates": 3, "problems": [
  {"dtype": "fp16", "head_dim": 64, "seqlen_q": 1024, "seqlen_k": 1024},
  {"pass": "backward", "dtype": "bf16", "head_dim": 64, "causal": "bottom-right", "seqlen_q": 1024, "seqlen_k": 1024},
  {"kv_cache": true, "dtype": "bf16", "head_dim": 64, "batch": 8, "seqlen_k": 4096}]}
EOF
cache=$work/kernel-cache
out=$work/out
export FLASHGEN=$flashgen SPEC=$spec CACHE=$cache OUT=$out  # what the job scripts read

# One array task: its shard from the array index (no --shard); a summary only when it ran to its end.
cat > "$work/compile-task.sh" << 'EOF'
#!/usr/bin/env bash
set -euo pipefail
run=$OUT/task-$SLURM_ARRAY_TASK_ID-run${SLURM_RESTART_COUNT:-0}
"$FLASHGEN" compile --spec "$SPEC" --arch sm_90a --cache-dir "$CACHE" --jobs 1 --json > "$run.json.part" 2> "$run.log"
mv "$run.json.part" "$run.json"
EOF
# The merge step: the whole spec again, which finds every kernel cached, and tune's dry run over the same cache.
cat > "$work/merge.sh" << 'EOF'
#!/usr/bin/env bash
set -euo pipefail
"$FLASHGEN" compile --spec "$SPEC" --arch sm_90a --cache-dir "$CACHE" --shard 0/1 --json > "$OUT/merge.json" 2> "$OUT/merge.log"
ls "$CACHE" > "$OUT/cache-before-dry-run.txt"
FLASHGEN_CACHE_DIR=$CACHE "$FLASHGEN" tune --spec "$SPEC" --dry-run --json --arch sm_90a --db "$OUT/sweep.sqlite" \
  > "$OUT/dry-run.json" 2>> "$OUT/merge.log"
ls "$CACHE" > "$OUT/cache-after-dry-run.txt"
EOF
chmod +x "$work/compile-task.sh" "$work/merge.sh"

say "the compile phase as a job array of 3 tasks, the merge after it"
array=$(sbatch --parsable --array=0-2 --job-name=fg-compile --output="$out/slurm-%A_%a.out" "$work/compile-task.sh")
first_merge=$(sbatch --parsable --dependency="afterok:$array" --job-name=fg-merge --output="$out/slurm-%j.out" \
  "$work/merge.sh")

killed_log=$out/task-1-run0.log
midway() { grep -q ': compiled in' "$killed_log" 2> /dev/null; }
wait_for 180 midway || fail "task 1 compiled nothing"
scancel "${array}_1"
say "killed task 1 midway: $(grep -c ': compiled in' "$killed_log") kernel(s) compiled"
state_of() { scontrol show job "$1" 2> /dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -n 1; }
cancelled() { [[ $(state_of "${array}_1") == CANCELLED ]]; }
wait_for 60 cancelled || fail "task 1 was not cancelled"
[[ ! -e $out/task-1-run0.json ]] || fail "task 1 ran to its end before it was killed"

# A requeued task keeps its array index, so its shard; Slurm holds a requeued job back two minutes unless told.
# slurmd refuses a job credential made within the second it revoked the job's last one, so the requeue waits that out.
sleep 2
scontrol requeue "${array}_1" || fail "scontrol requeue ${array}_1"
scontrol update JobId="${array}_1" StartTime=now || fail "scontrol update ${array}_1 StartTime=now"
# The first merge job waits on the array as a whole, which a cancelled task fails for good; the rerun's merge
# waits on the three tasks by their ids.
merge=$(sbatch --parsable --dependency="afterok:${array}_0:${array}_1:${array}_2" --job-name=fg-merge \
  --output="$out/slurm-%j.out" "$work/merge.sh")
ended() { [[ $(state_of "$1") =~ ^(FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]]; }
merged() { [[ -s $out/cache-after-dry-run.txt ]] || ended "$merge" || ended "${array}_1"; }
wait_for 300 merged || fail "the merge job did not run"
ended "${array}_1" && fail "the requeued task 1 ended $(state_of "${array}_1")"
[[ -s $out/cache-after-dry-run.txt ]] || fail "the merge job ended $(state_of "$merge")"
[[ $(state_of "$first_merge") == PENDING ]] || fail "the merge that waited on the whole array ran anyway"
scancel "$first_merge"

say "checking the shards, the resumed task, the merge and the cache"
python3 - "$out" "$cache" << 'EOF' || fail "the results do not check out"
import json, os, re, sys

out, cache = sys.argv[1], sys.argv[2]
def load(name):
    with open(os.path.join(out, name)) as f:
        return json.load(f)
def check(ok, what):
    if not ok:
        sys.exit("FAILED: " + what)

merge = load("merge.json")
tasks = {0: load("task-0-run0.json"), 1: load("task-1-run1.json"), 2: load("task-2-run0.json")}
for index, task in tasks.items():
    shard = task["shard"]
    check(shard == {"index": index, "count": 3, "source": "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT"},
          f"task {index}'s shard is {shard}")
    check(task["failed"] == 0 and task["target"] == "sm_90a", f"task {index}: {task['failed']} failed")
    check(len(task["problems"]) == 1, f"task {index} took {len(task['problems'])} problems, not 1")
    check(task["problems"][0]["candidates"] == merge["problems"][index]["candidates"],
          f"task {index} planned other candidates than the merge")

# The rerun of the killed task read back every kernel the killed run had compiled, and compiled only the rest.
killed = set(re.findall(r"\] (\S+) for sm_90a: compiled in", open(os.path.join(out, "task-1-run0.log")).read()))
rerun = {k["name"]: k["status"] for k in tasks[1]["kernels"]}
check(killed and all(rerun.get(name) == "cached" for name in killed),
      f"the rerun compiled again what the killed run had compiled: {killed} -> {rerun}")
check(tasks[1]["compiled"] + tasks[1]["cached"] == len(rerun) and tasks[1]["compiled"] < len(rerun),
      f"the rerun's counts: {tasks[1]['compiled']} compiled, {tasks[1]['cached']} cached of {len(rerun)}")

# The merge step finds the union of the shards' kernels, all of them cached.
union = set().union(*({k["name"] for k in t["kernels"]} for t in tasks.values()))
names = {k["name"] for k in merge["kernels"]}
check(names == union, f"the merge's kernels {sorted(names)} are not the shards' {sorted(union)}")
check(merge["compiled"] == 0 and merge["failed"] == 0 and merge["cached"] == len(names),
      f"the merge compiled {merge['compiled']}, failed {merge['failed']}")

# Tune plans the same candidates over the filled cache and compiles nothing doing so; each candidate's module is in it.
dry = load("dry-run.json")
check([p["candidates"] for p in dry["problems"]] == [p["candidates"] for p in merge["problems"]],
      "tune's dry run lists other candidates than the compile phase compiled")
modules = {re.sub(r"_split[0-9]+$", "", c) for p in dry["problems"] for c in p["candidates"]}
check(modules <= names, f"candidates missing from the compile phase: {sorted(modules - names)}")
before = open(os.path.join(out, "cache-before-dry-run.txt")).read()
check(before == open(os.path.join(out, "cache-after-dry-run.txt")).read(), "tune's dry run compiled a kernel")
files = os.listdir(cache)
for name in names:
    check(any(f.startswith(name + "-sm90-") and f.endswith(".cubin") for f in files), f"{name} is not in the cache")
print(f"{len(names)} kernels in {len(tasks)} shards; the rerun read {len(killed)} back and compiled {tasks[1]['compiled']}")
EOF
say "passed in $((SECONDS - started)) s"
