#!/usr/bin/env bash
# Regenerates BENCHMARKS.md's simulator part: every built-in scenario and both Azure traces (1×
# and ×4), every policy, with examples/simulate.toml; a cold-start sweep on the conversation
# trace; the plot of that trace (docs/azure-conv.svg). The grid section (from "## The grid", written
# from `hearth simulate --grid --markdown`, which takes about 25 minutes on 2 cores) and the
# "Agent benchmarks" section (daemon measurements) are kept as they are.
# Reads the Azure traces from HEARTH_TRACE_DIR (default: the repository's data/traces).
#   scripts/benchmarks.sh                  (a few minutes on 2 cores)
#   scripts/benchmarks.sh --smoke [DIR]    (seconds: every step, each run cut to 10 simulated
#                                           minutes, written to DIR (default: a temporary one),
#                                           BENCHMARKS.md and docs/ left alone; CI runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=
case "${1:-}" in
  "") ;;
  --smoke) smoke=1 ;;
  *) echo "usage: scripts/benchmarks.sh [--smoke [DIR]]" >&2; exit 2 ;;
esac
export HEARTH_TRACE_DIR="${HEARTH_TRACE_DIR:-$PWD/data/traces}"
cargo build --release --quiet
bin="${CARGO_TARGET_DIR:-target}/release/hearth"
cfg=examples/simulate.toml
out=BENCHMARKS.md
svg=docs/azure-conv.svg
cut=()
if [ -n "$smoke" ]; then
  dest=${2:-$(mktemp -d)}
  mkdir -p "$dest/docs"
  out=$dest/BENCHMARKS.md
  svg=$dest/docs/azure-conv.svg
  cut=(--duration 10m)
fi
agent=$(mktemp)
# Keep the grid and agent sections (written from the grid's and the agent benchmarks' output).
if [ -f BENCHMARKS.md ] && grep -q '^## The grid' BENCHMARKS.md; then
  sed -n '/^## The grid/,$p' BENCHMARKS.md >"$agent"
elif [ -f BENCHMARKS.md ] && grep -q '^## Agent benchmarks' BENCHMARKS.md; then
  sed -n '/^## Agent benchmarks/,$p' BENCHMARKS.md >"$agent"
fi
sim() { "$bin" simulate --config "$cfg" --model llm "$@" "${cut[@]}"; }
verdict() {
  # One line per run: is hearth beaten on both axes by any baseline?
  python3 -c '
import json, sys
r = json.load(sys.stdin)
P = {p["policy"]: p for p in r["policies"]}
h = P["hearth"]
beaten = [n for n, b in P.items() if not n.startswith("hearth") and n != "oracle" and (
    (b["replica_seconds"] <= 1.1 * h["replica_seconds"] and b["over_target"] < h["over_target"]) or
    (b["over_target"] <= h["over_target"] and b["replica_seconds"] < h["replica_seconds"]))]
print("| %s | %.2f %% | %.0f | %.2f | %d | %s |" % (sys.argv[1], 100 * h["over_target"], h["replica_seconds"],
      h["replica_seconds"] / max(P["oracle"]["replica_seconds"], 1e-9),
      h["killed"], "not beaten" if not beaten else "beaten by " + ", ".join(beaten)))
' "$1"
}
mkdir -p "$(dirname "$svg")"
{
  cat <<'HEAD'
# Benchmarks

## Reproducing a figure

Every figure below comes from one of these commands, run from the repository's root on a fresh
machine: Debian 12 with the Rust toolchain (rustup) and python3 with venv, as CI's, as root
where the table says so. `scripts/test.sh` installs what the test suite needs besides; the
extra needs are in the last column. A benchmark program run without `--bench` (`cargo test
--release --bench NAME`) is its smoke run, a few seconds with the same code; CI runs every
smoke run (`.ci/run`, "benchmarks") and checks that each prints its figures. The machine these
figures came from is described with each; on another the figures differ, the commands do not.

| figures | command | needs |
| --- | --- | --- |
| Simulator (this part, down to the grid), `docs/azure-conv.svg` | `scripts/benchmarks.sh` (one table: `hearth simulate --config examples/simulate.toml --model llm --scenario NAME --markdown`, `--rate-mult 4` for ×4) | the traces in `data/traces` |
| The grid | `hearth simulate --grid --markdown --jobs 2` | as above |
| Agent benchmarks | `cargo bench --bench report_to_routed` (`-- --reset scale`), `report_throughput`, `idle_footprint`, `report_core`; `cargo test --release --test agent autoscale -- --nocapture` | |
| Front door | `scripts/route-bench.sh 3 8` (`ROUTE_BENCH_HEARTH=PATH` for another build) | `apt-get install nginx wrk` (as root the replicas run as the account `hearth`, which the daemon makes) |
| Fleet: HAProxy with the agents' weights against its own balancing | `scripts/fleet-bench.sh` (30 s per policy) | `apt-get install haproxy` |
| Fleet: CPU per agent check | `cargo bench --bench agent_check` | |
| Replay through the front door | `cargo test --release --test route replay -- --nocapture` | |
| Chaos | `cargo test --release --test processes chaos -- --nocapture` | root, a writable cgroup v2 |
| Hardening: `status` under reporters, hostile connections | `cargo bench --bench hardening` (`-- --baseline PATH` runs another build first, for a comparison in one run) | root for the hostile connections to come from 8 users (else from one) |
| The worst cost of one event | `cargo bench --bench event_cost -- --repeat 5` | |
| Replicas outliving the daemon | `cargo bench --bench outlive` | root, a writable cgroup v2 |
| The front door under starvation attacks | `cargo bench --bench route_starve` | `ulimit -n` of 12,000 or more (10,000 idle connections, held at both ends) |
| Not recorded here: warm-up detection delay, the scraped wait against the true one, watchdog pings, weight prefetch, the router's JSON check | `cargo bench --bench warm_delay`, `scrape_wait`, `watchdog`, `prefetch`, `json_check` (each prints its goal beside its figure) | `scrape_wait`: llama.cpp's server (`scripts/real-model.sh`, made on first use); `prefetch`: 2 GiB of disk, root to drop the page cache |
| A GPU host | `scripts/gpu-smoke.sh [--xid]` (exit 0: passed; 1: a difference; 2: no GPU here, nothing checked) | an NVIDIA GPU and driver; `--xid`: nvcc |

## Simulator: `hearth simulate`

Generated by `scripts/benchmarks.sh` with `examples/simulate.toml` (8 slots per replica, 0.2 ms per
context token and 20 ms per generated token, cold start 60 s, promotion delay 500 ms, target wait
2 s, min 1, max 16, hearth's warm pool 2, `down_stabilization` 5 min, `down_step` 1 min), seed 1,
figures from the 5-minute mark on. Every policy sees the same arrivals; "replica-s" counts every
replica holding a GPU (starting, warm, routed, draining); efficiency is the work-conserving lower
bound (busy slot-seconds ÷ 8) ÷ replica-s. `hearth` is the real core (`crates/hearth-core/src/core/`) driven with
virtual time; `hearth-nopool` is the same with `warm_pool = 0`. The baselines, their published
defaults and sources are in `src/sim/baselines/`.

The Azure sections replay the **Azure LLM inference trace 2023** (Patel et al., "Splitwise:
Efficient generative LLM inference using phase splitting", ISCA 2024), licensed **CC-BY 4.0**;
arrivals at their recorded instants, no time compression (`--speed 1`); ×4 rows multiply the
rate (`--rate-mult 4`: each arrival replayed four times, the copies shifted by up to 1 s).

Reproduce one table: `hearth simulate --config examples/simulate.toml --model llm --scenario NAME`
(traces: `--scenario azure-conv` from the repository's root, which reads
`data/traces/azure-llm-2023-conv.csv`; elsewhere `--trace FILE` or `HEARTH_TRACE_DIR`). `--decisions` prints every scale decision of hearth with its reason.

### Is hearth beaten?

The criterion (issue 7): no baseline that spends ≤ 1.1× hearth's replica-seconds has a smaller
share over target, and no baseline with a share over target ≤ hearth's spends fewer
replica-seconds; and hearth kills no request on scale-down. Checked at seed 1 by
`tests/simulate.rs` in CI. One seed and one setting say little: the grid below is the judge.
"÷ oracle" is hearth's replica-seconds over the clairvoyant oracle's.

| run | hearth over target | hearth replica-s | ÷ oracle | killed | verdict |
| --- | ---: | ---: | ---: | ---: | --- |
HEAD
  for s in step burst diurnal sawtooth flash-crowd azure-conv azure-code; do
    sim --scenario "$s" --json 2>/dev/null | verdict "$s"
  done
  for s in azure-conv azure-code; do
    sim --scenario "$s" --rate-mult 4 --json 2>/dev/null | verdict "$s ×4"
  done
  cat <<'MID'

The burst scenario (90-s bursts at 5× every 10 min, shorter than cold start plus stabilization)
is one no reactive policy serves cheaply: hearth misses the first burst (a cold start behind),
then holds what the bursts need through the stabilization window and steps down one replica a
minute. HPA on utilisation never leaves `max` and misses nothing; hearth spends just under 1/1.1
of that, a margin of a fraction of a percent that goes either way with the seed.

Over seeds 1–5 of the five scenarios (`--seed N`, the traces have one), hearth is beaten in 1 of
25 runs: `burst` at seed 2, by HPA on utilisation at 1.087× its cost. The policy `main` had before
the envelope was beaten in 6 of them (`step` at seeds 3–5 and `flash-crowd` at 2, 4 and 5, by
KPA); the envelope as first built in 11 (`step` at all five), because a rise was sized at the
bound of its noise test: a step from 4 to 16/s read as 12/s, and the capacity ordered for it fell
short for a whole cold start. A rise is now sized at its reading, plus what drains the backlog it
builds meanwhile.

MID
  for s in step burst diurnal sawtooth flash-crowd azure-conv azure-code; do
    sim --scenario "$s" --markdown 2>/dev/null
    echo
  done
  for s in azure-conv azure-code; do
    sim --scenario "$s" --rate-mult 4 --markdown 2>/dev/null | sed "1s/^### $s\$/### $s ×4/"
    echo
  done
  echo "### Cold start from 10 s to 240 s (azure-conv, ×1)"
  echo
  echo "Share of requests over target / replica-seconds, per policy and cold start."
  echo
  python3 - "$bin" "$cfg" "${cut[@]}" <<'PY'
import json, subprocess, sys
bin, cfg, cut = sys.argv[1], sys.argv[2], sys.argv[3:]
colds = ["10s", "30s", "60s", "120s", "240s"]
rows = {}
for c in colds:
    out = subprocess.run([bin, "simulate", "--config", cfg, "--model", "llm", "--scenario", "azure-conv",
                          "--cold-start", c, "--json", *cut], capture_output=True, text=True, check=True).stdout
    for p in json.loads(out)["policies"]:
        rows.setdefault(p["policy"], []).append("%.2f %% / %.0f" % (100 * p["over_target"], p["replica_seconds"]))
print("| policy | " + " | ".join("cold " + c for c in colds) + " |")
print("| --- |" + " ---: |" * len(colds))
for name, cells in rows.items():
    print("| %s | %s |" % (name, " | ".join(cells)))
PY
  echo
  echo "### The conversation trace, drawn"
  echo
  echo "![azure-conv: arrivals, oldest wait and replicas per policy](docs/azure-conv.svg)"
  echo
  sim --scenario azure-conv --plot "$svg" >/dev/null 2>&1
  if [ -s "$agent" ]; then
    echo
    cat "$agent"
  fi
} >"$out"
rm -f "$agent"
echo "wrote $out and $svg"
