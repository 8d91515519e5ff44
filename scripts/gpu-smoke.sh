#!/usr/bin/env bash
# gpu-smoke.sh: a self-contained check of hearth on a real GPU host, in under 4 minutes, without
# network. It starts its own daemon (backend = "nvml") in a temporary directory and checks:
#
#   1. `hearth gpus --json` against nvidia-smi: the same devices (GPU or MIG UUIDs) and, for whole
#      GPUs, the same total memory;
#   2. memory attribution: a small CUDA allocation by a process this script starts (PyTorch or
#      CuPy, where one is installed) shows as foreign memory on its device, and hearth's `used`
#      agrees with nvidia-smi's;
#   3. two toy replicas packed on one GPU start (one at a time), and after the daemon stops
#      nothing of theirs is left: no process, nothing on the GPU;
#   4. with --xid, where nvcc is installed: a kernel that faults (an application XID, 13 or 31)
#      is seen by hearth and leaves the device in service;
#   5. sleep and wake on the device, where PyTorch or CuPy is installed: a model with
#      [model.sleep] (vLLM's endpoints, level 1) boots with one replica routed and its pool of
#      one asleep; a scale up wakes it (no cold start) and a scale down puts one back to sleep.
#      It reports the wake time (hearth's `status`) and the device memory each sleep freed, as
#      NVML sees it (nvidia-smi), and fails if a sleep frees less than 80 % of what the replica
#      holds. The replicas are vLLM itself where it is installed and HEARTH_SMOKE_VLLM_MODEL
#      names a local model (then allow 7 minutes), else scripts/gpu-sleep-standin.py, which
#      frees and restores a real allocation of 4 GiB through PyTorch or CuPy.
#
# Usage: scripts/gpu-smoke.sh [--xid] [path/to/hearth]   (default: target/release/hearth)
# Needs: nvidia-smi, python3 (to read JSON).
# Exits 0 when every check passed; 1 at the first difference (or a missing tool); 2, having
# checked nothing, on a machine with no NVIDIA GPU (no nvidia-smi, no driver, or no device),
# saying so on stderr: "gpu-smoke: no NVIDIA GPU here (…); nothing checked". CI runs it on a
# machine without one and checks that answer.
set -euo pipefail

xid=0
hearth=""
for arg in "$@"; do
  case "$arg" in
    --xid) xid=1 ;;
    -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
    *) hearth="$arg" ;;
  esac
done
here="$(cd "$(dirname "$0")/.." && pwd)"
hearth="${hearth:-$here/target/release/hearth}"
deadline=$((SECONDS + 230))
vllm_model="${HEARTH_SMOKE_VLLM_MODEL:-}"
if [[ -n "$vllm_model" ]]; then deadline=$((deadline + 180)); fi

say() { printf '%s\n' "gpu-smoke: $*"; }
fail() { printf '%s\n' "gpu-smoke: FAIL: $*" >&2; exit 1; }
need() { command -v "$1" > /dev/null 2>&1 || fail "$1 is not installed"; }
left() { ((SECONDS < deadline)) || fail "out of time ($((deadline / 60)) minutes)"; }

no_gpu() { printf '%s\n' "gpu-smoke: no NVIDIA GPU here ($*); nothing checked" >&2; exit 2; }

command -v nvidia-smi > /dev/null 2>&1 || no_gpu "nvidia-smi is not installed"
gpu_list="$(nvidia-smi -L 2>&1)" || no_gpu "nvidia-smi cannot talk to the driver: ${gpu_list//$'\n'/ }"
grep -q '^GPU ' <<< "$gpu_list" || no_gpu "nvidia-smi lists no device"
need python3
[[ -x "$hearth" ]] || fail "no hearth binary at $hearth (build it, or pass its path)"

tmp="$(mktemp -d /tmp/hearth-gpu-smoke.XXXXXX)"
chmod 755 "$tmp"
sock="$tmp/hearth.sock"
daemon_pid=""
helper_pid=""
replica_pids=()
cleanup() {
  if [[ -n "$helper_pid" ]]; then kill "$helper_pid" 2> /dev/null || true; fi
  if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2> /dev/null; then
    kill -TERM "$daemon_pid" 2> /dev/null || true
    for _ in $(seq 1 100); do kill -0 "$daemon_pid" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$daemon_pid" 2> /dev/null || true
  fi
  for p in "${replica_pids[@]}"; do kill -KILL "$p" 2> /dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# JSON on stdin, a Python expression of `j` on the command line.
jq_py() { python3 -c 'import json,sys; j=json.load(sys.stdin); r=eval(sys.argv[1]); print(r if not isinstance(r,(list,dict)) else json.dumps(r))' "$1"; }
cli() { "$hearth" "$@" --socket "$sock"; }

# ---- the daemon ---------------------------------------------------------------------------
port0=$((21000 + RANDOM % 20000))
user="$(id -un)"
cat > "$tmp/config.toml" << TOML
[daemon]
socket = "$sock"
state_dir = "$tmp/state"
ports = "$port0-$((port0 + 20))"
tick = "200ms"

[gpus]
backend = "nvml"

[[model]]
name = "smoke"
command = ["$hearth", "toy-server", "--port", "{port}", "--load-time", "1s"]
user = "$user"
gpus = 1
gpu_memory = "1GiB"
placement = "pack"
device_naming = "index"
stop_grace = "5s"

[model.warmup]
url = "http://127.0.0.1:{port}/v1/completions"
body = '{"model":"smoke","prompt":"Hello","max_tokens":4}'
headers = { "content-type" = "application/json" }
expect_status = 200
expect_body = "choices"
timeout = "10s"
startup_timeout = "60s"
recheck = "5m"

[model.scaling]
min = 0
max = 2
warm_pool = 0
TOML
"$hearth" check-config "$tmp/config.toml" > /dev/null || fail "check-config refused the smoke configuration"
"$hearth" daemon --config "$tmp/config.toml" > "$tmp/stdout" 2> "$tmp/log" &
daemon_pid=$!
for _ in $(seq 1 100); do
  cli gpus --json > /dev/null 2>&1 && break
  kill -0 "$daemon_pid" 2> /dev/null || { cat "$tmp/log" >&2; fail "the daemon exited"; }
  sleep 0.2
done
cli gpus --json > "$tmp/gpus.json" || fail "the daemon does not answer"
grep -q "GPU inventory: nvml" "$tmp/log" || { cat "$tmp/log" >&2; fail "the daemon is not on NVML"; }
say "$(grep -o 'GPU inventory: .*' "$tmp/log" | head -1)"

# ---- 1. devices against nvidia-smi ---------------------------------------------------------
mig_on="$(nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader 2> /dev/null | grep -c Enabled || true)"
smi_uuids="$(
  nvidia-smi -L | python3 -c '
import re, sys
gpu = None
out = []
lines = sys.stdin.read().splitlines()
# A GPU with MIG instances listed under it is its instances; otherwise itself.
for i, l in enumerate(lines):
    m = re.search(r"UUID: (GPU-[0-9a-fA-F-]+)", l)
    if m:
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if "MIG-" not in nxt:
            out.append(m.group(1))
    m = re.search(r"UUID: (MIG-[^)]+)\)", l)
    if m:
        out.append(m.group(1))
print("\n".join(sorted(out)))'
)"
hearth_uuids="$(jq_py '"\n".join(sorted(g["uuid"] for g in j))' < "$tmp/gpus.json")"
[[ "$smi_uuids" == "$hearth_uuids" ]] || fail "devices differ: nvidia-smi: [$smi_uuids] hearth: [$hearth_uuids]"
say "devices: $(echo "$hearth_uuids" | wc -l) match nvidia-smi ($mig_on GPU(s) in MIG mode)"
while IFS=, read -r uuid total; do
  uuid="${uuid// /}"; total="${total// /}"
  theirs="$(jq_py "[g['memory_total'] for g in j if g['uuid']=='$uuid'][0] // (1<<20)" < "$tmp/gpus.json")"
  [[ "$theirs" == "$total" ]] || fail "$uuid: total memory: nvidia-smi ${total} MiB, hearth ${theirs} MiB"
done < <(nvidia-smi --query-gpu=uuid,memory.total --format=csv,noheader,nounits | grep -v '\[N/A\]')
say "total memory matches nvidia-smi"

# ---- 2. memory attribution -------------------------------------------------------------------
first="$(jq_py '[g["uuid"] for g in j if g["healthy"] and g.get("mig_parent") is None][0]' < "$tmp/gpus.json")"
first_index="$(jq_py "[g['index'] for g in j if g['uuid']=='$first'][0]" < "$tmp/gpus.json")"
alloc='
import sys, time
n = 256 << 20
try:
    import torch
    x = torch.empty(n, dtype=torch.uint8, device="cuda:0")
except ImportError:
    import cupy
    x = cupy.empty(n, dtype=cupy.uint8)
print("allocated", flush=True)
time.sleep(120)'
if python3 -c 'import torch' 2> /dev/null || python3 -c 'import cupy' 2> /dev/null; then
  CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES="$first_index" python3 -c "$alloc" > "$tmp/alloc.out" 2>&1 &
  helper_pid=$!
  for _ in $(seq 1 150); do grep -q allocated "$tmp/alloc.out" && break; sleep 0.2; done
  grep -q allocated "$tmp/alloc.out" || fail "the CUDA allocation did not happen: $(cat "$tmp/alloc.out")"
  sleep 7 # the next memory reading (every 5 s)
  cli gpus --json > "$tmp/gpus2.json"
  foreign="$(jq_py "[g['memory_foreign'] for g in j if g['uuid']=='$first'][0]" < "$tmp/gpus2.json")"
  used="$(jq_py "[g['memory_used'] for g in j if g['uuid']=='$first'][0] // (1<<20)" < "$tmp/gpus2.json")"
  smi_used="$(nvidia-smi --id="$first" --query-gpu=memory.used --format=csv,noheader,nounits | tr -d ' ')"
  ((foreign >= 256 << 20)) || fail "$first: the helper's 256 MiB is not foreign (foreign = $foreign bytes)"
  diff=$((used > smi_used ? used - smi_used : smi_used - used))
  ((diff <= 64 + smi_used / 20)) || fail "$first: used: hearth ${used} MiB, nvidia-smi ${smi_used} MiB"
  say "attribution: the helper's allocation is foreign ($((foreign >> 20)) MiB); used ${used} MiB vs nvidia-smi ${smi_used} MiB"
  kill "$helper_pid"; wait "$helper_pid" 2> /dev/null || true; helper_pid=""
else
  say "attribution: SKIPPED (neither PyTorch nor CuPy is installed)"
fi
left

# ---- 3. two replicas on one GPU, nothing left after stop ------------------------------------
cli scale smoke --min 2 > /dev/null
for _ in $(seq 1 300); do
  n="$(cli status --json | jq_py 'sum(1 for m in j["models"] for r in m["replicas"] if r["state"]=="routed")')"
  [[ "$n" == 2 ]] && break
  left
  sleep 0.2
done
cli status --json > "$tmp/status.json"
[[ "$n" == 2 ]] || fail "two replicas did not become routed: $(cat "$tmp/status.json")"
devices="$(jq_py '",".join(sorted(set(",".join(r["gpus"]) for m in j["models"] for r in m["replicas"])))' < "$tmp/status.json")"
[[ "$devices" != *,* ]] || fail "pack put the two replicas on different GPUs: $devices"
mapfile -t replica_pids < <(jq_py '"\n".join(str(r["pid"]) for m in j["models"] for r in m["replicas"])' < "$tmp/status.json")
say "two replicas routed on $devices (pids ${replica_pids[*]})"
kill -TERM "$daemon_pid"
for _ in $(seq 1 300); do kill -0 "$daemon_pid" 2> /dev/null || break; sleep 0.1; done
if kill -0 "$daemon_pid" 2> /dev/null; then fail "the daemon did not stop within 30 s"; fi
wait "$daemon_pid" 2> /dev/null || true
daemon_pid=""
for p in "${replica_pids[@]}"; do
  [[ ! -e "/proc/$p" ]] || fail "replica process $p is left after stop"
done
apps="$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2> /dev/null || true)"
for p in "${replica_pids[@]}"; do
  ! grep -qx "$p" <<< "$apps" || fail "replica process $p still holds GPU memory"
done
[[ ! -e "$sock" ]] || fail "the socket is left after stop"
say "stop: no replica process left, none on the GPU"
left

# ---- 4. an application XID (optional) --------------------------------------------------------
if ((xid)); then
  if ! command -v nvcc > /dev/null 2>&1; then
    say "xid: SKIPPED (nvcc is not installed)"
  else
    cat > "$tmp/fault.cu" << 'CU'
__global__ void bad(int *p) { *p = 1; }
int main() { bad<<<1, 1>>>((int *)0x10); cudaDeviceSynchronize(); return 0; }
CU
    nvcc -o "$tmp/fault" "$tmp/fault.cu" > /dev/null || fail "nvcc could not build the fault kernel"
    "$hearth" daemon --config "$tmp/config.toml" > "$tmp/stdout" 2> "$tmp/log2" &
    daemon_pid=$!
    for _ in $(seq 1 100); do cli gpus --json > /dev/null 2>&1 && break; sleep 0.2; done
    CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES="$first_index" "$tmp/fault" > /dev/null 2>&1 || true
    for _ in $(seq 1 100); do grep -q "XID" "$tmp/log2" && break; sleep 0.2; done
    grep -q "XID" "$tmp/log2" || fail "no XID in hearth's log after the faulting kernel"
    healthy="$(cli gpus --json | jq_py "[g['healthy'] for g in j if g['uuid']=='$first'][0]")"
    [[ "$healthy" == True ]] || fail "$first: an application XID took the device out of service"
    say "xid: $(grep -o 'XID [0-9]*[^"]*' "$tmp/log2" | head -1); the device stays in service"
  fi
fi

# ---- 5. sleep and wake on the device ----------------------------------------------------------
# The device memory in use on the first device, in MiB, as NVML (nvidia-smi) reads it.
smi_used() { nvidia-smi --id="$first" --query-gpu=memory.used --format=csv,noheader,nounits | tr -d ' '; }
# Waits until the model `sleepy` shows `want` (a Python expression of its status `m`).
wait_sleepy() {
  local want="$1" what="$2" got
  while :; do
    got="$(cli status --json | jq_py "[m for m in j['models'] if m['name']=='sleepy'][0]")"
    [[ "$(jq_py "(lambda m: $want)(j)" <<< "$got")" == True ]] && return 0
    kill -0 "$daemon_pid" 2> /dev/null || { tail -20 "$tmp/log3" >&2; fail "the daemon exited"; }
    ((SECONDS < deadline)) || { echo "$got" >&2; tail -20 "$tmp/log3" >&2; fail "sleep: $what did not happen in time"; }
    sleep 0.2
  done
}
standin_gib=4
if [[ -n "$vllm_model" ]] && python3 -c 'import vllm' 2> /dev/null; then
  total_mib="$(nvidia-smi --id="$first" --query-gpu=memory.total --format=csv,noheader,nounits | tr -d ' ')"
  sleep_server="vllm ($vllm_model)"
  sleep_command="[\"vllm\", \"serve\", \"$vllm_model\", \"--host\", \"127.0.0.1\", \"--port\", \"{port}\", \"--enable-sleep-mode\", \"--gpu-memory-utilization\", \"0.25\", \"--max-model-len\", \"2048\"]"
  sleep_memory="$((total_mib * 28 / 100))MiB"
  sleep_host="$sleep_memory"
  warm_model="$vllm_model"
  startup="300s"
  held_mib=$((total_mib * 25 / 100))
elif python3 -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null || python3 -c 'import cupy' 2> /dev/null; then
  sleep_server="scripts/gpu-sleep-standin.py ($standin_gib GiB through $(python3 -c 'import torch' 2> /dev/null && echo PyTorch || echo CuPy))"
  sleep_command="[\"python3\", \"$here/scripts/gpu-sleep-standin.py\", \"--host\", \"127.0.0.1\", \"--port\", \"{port}\", \"--gib\", \"$standin_gib\"]"
  sleep_memory="$((standin_gib + 2))GiB"
  sleep_host="$((standin_gib + 1))GiB"
  warm_model="sleepy"
  startup="120s"
  held_mib=$((standin_gib * 1024))
else
  sleep_server=""
fi
if [[ -z "$sleep_server" ]]; then
  say "sleep: SKIPPED (neither PyTorch nor CuPy is installed, nor vLLM with HEARTH_SMOKE_VLLM_MODEL)"
else
  cat > "$tmp/sleep.toml" << TOML
[daemon]
socket = "$sock"
state_dir = "$tmp/state-sleep"
ports = "$port0-$((port0 + 20))"
tick = "200ms"

[gpus]
backend = "nvml"

[[model]]
name = "sleepy"
command = $sleep_command
env = { VLLM_SERVER_DEV_MODE = "1" }
user = "$user"
gpus = 1
gpu_memory = "$sleep_memory"
placement = "pack"
device_naming = "index"
stop_grace = "10s"

[model.warmup]
url = "http://127.0.0.1:{port}/v1/completions"
body = '{"model":"$warm_model","prompt":"Hello","max_tokens":4}'
headers = { "content-type" = "application/json" }
expect_status = 200
expect_body = "choices"
timeout = "30s"
startup_timeout = "$startup"
recheck = "5m"

[model.sleep]
format = "vllm"
level = 1
host_memory = "$sleep_host"
gpu_memory_asleep = "1GiB"
wake_timeout = "60s"
idle_to_sleep = "10s"

[model.scaling]
min = 1
max = 2
warm_pool = 1
target_wait = "500ms"
drain_timeout = "30s"
TOML
  "$hearth" check-config "$tmp/sleep.toml" > /dev/null || fail "check-config refused the sleep configuration"
  "$hearth" daemon --config "$tmp/sleep.toml" > "$tmp/stdout" 2> "$tmp/log3" &
  daemon_pid=$!
  say "sleep: replicas are $sleep_server"
  wait_sleepy 'sorted(r["state"] for r in m["replicas"]) == ["routed", "sleeping"]' "boot to one routed and its pool asleep"
  cli status --json > "$tmp/sleep1.json"
  pids() { jq_py '" ".join(sorted(str(r["pid"]) for m in j["models"] for r in m["replicas"]))'; }
  sleep_pids="$(pids < "$tmp/sleep1.json")"
  read -ra replica_pids <<< "$sleep_pids"
  one_awake="$(smi_used)"
  # A queue over target wakes the pool: reported model-wide, as a front door would.
  t0=$SECONDS
  until cli status --json | jq_py "[r['state'] for m in j['models'] for r in m['replicas']] == ['routed', 'routed']" | grep -q True; do
    cli report sleepy --wait-ms 5000 --depth 16 --in-flight 16 > /dev/null
    ((SECONDS < deadline)) || { cli status --json >&2; fail "sleep: a queue did not wake the pool"; }
    sleep 0.2
  done
  woke_in=$((SECONDS - t0))
  cli status --json > "$tmp/sleep2.json"
  wake_ms="$(jq_py "[m for m in j['models'] if m['name']=='sleepy'][0]['wake']['last_ms']" < "$tmp/sleep2.json")"
  [[ "$(pids < "$tmp/sleep2.json")" == "$sleep_pids" ]] || fail "sleep: the wake started a replica (pids $sleep_pids, now $(pids < "$tmp/sleep2.json"))"
  two_awake="$(smi_used)"
  # No work for idle_to_sleep: both go to sleep. Each replica's own report of no work ends its
  # drain (nothing else reports for it here).
  until cli status --json | jq_py "[r['state'] for m in j['models'] for r in m['replicas']] == ['sleeping', 'sleeping']" | grep -q True; do
    cli report sleepy --wait-ms 0 --depth 0 --in-flight 0 > /dev/null
    for id in $(cli status --json | jq_py '" ".join(r["id"] for m in j["models"] for r in m["replicas"])'); do
      cli report sleepy --replica "$id" --wait-ms 0 --depth 0 --in-flight 0 > /dev/null
    done
    ((SECONDS < deadline)) || { cli status --json >&2; fail "sleep: idle_to_sleep did not put both to sleep"; }
    sleep 0.2
  done
  none_awake="$(smi_used)"
  [[ "$(cli status --json | pids)" == "$sleep_pids" ]] || fail "sleep: a replica was stopped or started"
  took=$((two_awake - one_awake))
  freed=$(((two_awake - none_awake) / 2))
  say "sleep: wake ${wake_ms} ms as hearth measured it (wake request → warm-up passed; ${woke_in}s from the first report to routed as seen here); no cold start"
  say "sleep: device memory used (nvidia-smi): one awake ${one_awake} MiB, two ${two_awake} MiB, none ${none_awake} MiB; a wake took ${took} MiB back and a sleep freed ${freed} MiB, of about ${held_mib} MiB a replica holds"
  ((freed * 10 >= held_mib * 8)) || fail "sleep: a sleep freed ${freed} MiB of the ${held_mib} MiB a replica holds"
  ((took * 10 >= held_mib * 8)) || fail "sleep: the wake took back only ${took} MiB of ${held_mib} MiB"
  kill -TERM "$daemon_pid"
  for _ in $(seq 1 300); do kill -0 "$daemon_pid" 2> /dev/null || break; sleep 0.1; done
  if kill -0 "$daemon_pid" 2> /dev/null; then fail "the daemon did not stop within 30 s"; fi
  wait "$daemon_pid" 2> /dev/null || true
  daemon_pid=""
  for p in $sleep_pids; do
    [[ ! -e "/proc/$p" ]] || fail "sleep: replica process $p is left after stop"
  done
  say "sleep: stop: no replica process left"
fi

say "OK in ${SECONDS}s"
