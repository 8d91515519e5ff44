#!/usr/bin/env bash
# The fleet bench (docs/fleet.md): three hosts on 127.0.0.2, .3 and .4 from
# examples/fleet/hearth.toml behind HAProxy, one host hot (its replicas at max with a queue, from
# clients straight at it), and short requests through HAProxy with agent weights (the example's
# haproxy.cfg), then plain `balance roundrobin`, then plain `balance leastconn`. Prints, per
# policy, the requests over the target wait, the p99 wait and the failures (BENCHMARKS.md,
# "Fleet", records a run). Bench, not test: nothing is asserted.
#
# Needs Debian's haproxy: apt-get install haproxy
#   scripts/fleet-bench.sh [SECONDS]      30 s per policy by default, after host 1 reached max
#   scripts/fleet-bench.sh --smoke        3 s per policy, without waiting for max: seconds
set -euo pipefail
cd "$(dirname "$0")/.."
command -v haproxy >/dev/null || { echo "needs haproxy: apt-get install haproxy" >&2; exit 2; }
if [ "${1:-}" = --smoke ]; then
  exec cargo bench --quiet --bench fleet -- --smoke
fi
exec cargo bench --quiet --bench fleet -- --seconds "${1:-30}"
