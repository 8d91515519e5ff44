#!/usr/bin/env bash
# The front door's benchmark: what `hearth route` adds to a request, against calling the replica
# directly and against nginx as a plain reverse proxy, in the same run; and its memory per queued
# request. Prints the figures (BENCHMARKS.md, "Front door", records a run).
#
# Needs nginx and wrk from Debian: apt-get install nginx wrk (nothing else: as root, the replicas
# run as the unprivileged account hearth, which the daemon makes on a fresh machine)
#   scripts/route-bench.sh [ROUNDS] [SECONDS]      (default 3 rounds of 8 s per point)
#   scripts/route-bench.sh 1 2                     (its smoke run, about 40 s; CI runs it)
#   ROUTE_BENCH_HEARTH=/path/to/hearth scripts/route-bench.sh …   (that binary, not a fresh build:
#   to compare two builds back to back in one sitting)
#   ROUTE_BENCH_POINTS="1 64p" (default "1 64 256 64p 256p": clients, p for paced),
#   ROUTE_BENCH_QUEUED=N (default 2000: requests queued for the memory figure)
#
# Setup: the real daemon runs one replica of a model whose server is nginx answering a fixed
# completion (the fastest server there is, so that what is measured is the proxies); the router
# gets that replica's routed set from the daemon's watch. A second nginx proxies to the same
# replica with keep-alive connections and no buffering (what the router does). wrk runs 1, 64
# and 256 connections against each of: the replica, the router, nginx; the order rotates each
# round, and each figure is the median over rounds. Everything shares the machine's cores.
#
# Memory per queued request: a second model whose replica (hearth toy-server) takes one request
# for 10 minutes; N clients send one request each, the router queues N-1 of them; the router's
# RSS growth divided by N is the figure (each queued request with its client connection).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-8}
queued=${ROUTE_BENCH_QUEUED:-2000}
for tool in nginx wrk; do
  command -v "$tool" >/dev/null || { echo "needs $tool: apt-get install nginx wrk" >&2; exit 2; }
done
if [ -n "${ROUTE_BENCH_HEARTH:-}" ]; then
  hearth=$(realpath "$ROUTE_BENCH_HEARTH")
else
  cargo build --release --quiet
  hearth=$(realpath "${CARGO_TARGET_DIR:-target}/release/hearth")
fi
dir=$(mktemp -d /tmp/route-bench.XXXXXX)
pids=()
cleanup() {
  # The daemon first, while the router still reports its replicas idle (their drains end at
  # once); then the rest. Whatever is still there after 10 s is killed.
  for p in "${pids[@]}"; do
    kill "$p" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  [ -f "$dir/proxy.pid" ] && kill "$(cat "$dir/proxy.pid")" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

body='{"id":"cmpl-bench","object":"text_completion","created":0,"model":"bench","choices":[{"index":0,"text":" ok","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}'
mkdir -p "$dir/logs" "$dir/replica"
# As root the daemon runs a model without `user` as its unprivileged account (hearth, which it
# makes on a fresh machine): the replica's nginx may write only where that account may, so its
# config, pid, log and every temp directory nginx would otherwise make under /var/lib/nginx (root's,
# or www-data's once the packaged service ran) live in a directory of the replica's own. `-e`
# moves the log nginx opens before it reads its configuration.
chmod 0755 "$dir"
chmod 1777 "$dir/replica"
cat >"$dir/upstream.conf.in" <<EOF
worker_processes 1;
daemon off;
pid $dir/replica/up-@PORT@.pid;
error_log $dir/replica/up-@PORT@.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $dir/replica/tmp-@PORT@-body;
  proxy_temp_path $dir/replica/tmp-@PORT@-proxy;
  fastcgi_temp_path $dir/replica/tmp-@PORT@-fastcgi;
  uwsgi_temp_path $dir/replica/tmp-@PORT@-uwsgi;
  scgi_temp_path $dir/replica/tmp-@PORT@-scgi;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  server {
    listen 127.0.0.1:@PORT@;
    location / { default_type application/json; return 200 '$body'; }
  }
}
EOF
# The slow model's server is this hearth binary, which the replicas' account must be able to run:
# a checkout it cannot enter (under /root, say) gets a copy in the scratch directory.
if [ "$(id -u)" = 0 ] && ! setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$hearth"; then
  mkdir -p "$dir/bin"
  install -m 0755 "$hearth" "$dir/bin/hearth"
  hearth=$dir/bin/hearth
fi
ports_first=$(free_port)
rport=$(free_port)
sock=$dir/hearth.sock
cat >"$dir/config.toml" <<EOF
[daemon]
socket = "$sock"
state_dir = "$dir/state"
ports = "$((ports_first + 1))-$((ports_first + 9))"
tick = "250ms"

[gpus]
backend = "auto"

[[model]]
name = "bench"
command = ["sh", "-c", "sed 's/@PORT@/{port}/g' $dir/upstream.conf.in > $dir/replica/up-{port}.conf && exec nginx -p $dir/replica -e $dir/replica/up-{port}.err -c $dir/replica/up-{port}.conf"]
gpus = 0
stop_grace = "2s"
slots = 4096
[model.warmup]
url = "http://127.0.0.1:{port}/v1/completions"
body = '{"model":"bench","prompt":"hi"}'
expect_body = "choices"
[model.scaling]
min = 1
max = 1

[[model]]
name = "slow"
command = ["$hearth", "toy-server", "--port", "{port}", "--service-time", "10m"]
gpus = 0
stop_grace = "1s"
[model.warmup]
url = "http://127.0.0.1:{port}/health"
method = "GET"
expect_body = "ok"
[model.scaling]
min = 1
max = 1

[route]
listen = "127.0.0.1:$rport"
[route.model.slow]
max_queue = 100000
EOF
HEARTH_SOCKET= "$hearth" daemon --config "$dir/config.toml" >"$dir/logs/daemon.log" 2>&1 &
pids+=($!)
"$hearth" route --config "$dir/config.toml" >"$dir/logs/route.log" 2>&1 &
route_pid=$!
pids+=($route_pid)
status() { HEARTH_SOCKET=$sock "$hearth" status --json 2>/dev/null; }
upstream=
for _ in $(seq 1 200); do
  upstream=$(status | python3 -c '
import json, sys
m = {m["name"]: m for m in json.load(sys.stdin)["models"]}
r = [x for x in m["bench"]["replicas"] if x["state"] == "routed"]
s = [x for x in m["slow"]["replicas"] if x["state"] == "routed"]
print(r[0]["addr"] if r and s else "")' 2>/dev/null || true)
  [ -n "$upstream" ] && break
  sleep 0.1
done
if [ -z "$upstream" ]; then
  cat "$dir/logs/daemon.log"
  for f in "$dir"/replica/*.err; do [ -s "$f" ] && { echo "== $f"; cat "$f"; }; done
  echo "the replicas never became routed" >&2
  exit 1
fi
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$rport/metrics" | grep -q '^hearth_route_routed_replicas{model="bench"} 1' && break
  sleep 0.1
done

nport=$(free_port)
mkdir -p "$dir/proxy"
cat >"$dir/proxy.conf" <<EOF
worker_processes auto;
pid $dir/proxy.pid;
error_log $dir/logs/proxy.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $dir/proxy/body;
  proxy_temp_path $dir/proxy/tmp;
  fastcgi_temp_path $dir/proxy/fastcgi;
  uwsgi_temp_path $dir/proxy/uwsgi;
  scgi_temp_path $dir/proxy/scgi;
  keepalive_requests 10000000;
  upstream replica { server $upstream; keepalive 1024; }
  server {
    listen 127.0.0.1:$nport;
    location / {
      proxy_pass http://replica;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering on;
    }
  }
}
EOF
nginx -p "$dir" -e "$dir/logs/proxy.err" -c "$dir/proxy.conf"

cat >"$dir/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body   = '{"model":"bench","prompt":"Hello there","max_tokens":4}'
wrk.headers["Content-Type"] = "application/json"
EOF
# wrk's latency figure in microseconds.
to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); print v} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v*1000} else if (v ~ /s$/) {sub(/s$/,"",v); print v*1000000}}'; }
# Paced: each connection waits DELAY ms after an answer before its next request, so that 64 or
# 256 clients together send about 3000 requests/s, well below what any of the three can serve on
# two cores: latency without queueing for a CPU.
for c in 64 256; do
  { cat "$dir/post.lua"; echo "function delay() return $((c * 1000 / 3000)) end"; } >"$dir/paced-$c.lua"
done
# CPU time (user + system, clock ticks) of a process and its children (nginx's workers).
ticks() {
  local total=0 p
  for p in "$@" $(for q in "$@"; do pgrep -P "$q"; done); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)
run_wrk() { # target conns paced pids… → "p50_us p99_us rps cpu_us_per_request"
  local url=$1 c=$2 paced=$3 t script=$dir/post.lua
  shift 3
  t=$((c < 2 ? 1 : 2))
  [ -n "$paced" ] && script=$dir/paced-$c.lua
  local out before after
  before=$(ticks "$@")
  out=$(wrk -t"$t" -c"$c" -d"${secs}s" --latency -s "$script" "$url/v1/completions")
  after=$(ticks "$@")
  if grep -q "Non-2xx" <<<"$out"; then echo "non-2xx answers from $url: $out" >&2; exit 1; fi
  local p50 p99 rps n
  p50=$(awk '$1=="50%"{print $2}' <<<"$out" | to_us)
  p99=$(awk '$1=="99%"{print $2}' <<<"$out" | to_us)
  rps=$(awk '/Requests\/sec/{print $2}' <<<"$out")
  n=$(awk '/requests in/{print $1}' <<<"$out")
  echo "$p50 $p99 $rps $(python3 -c "print(round(($after - $before) * 1e6 / $hz / max($n, 1), 1))")"
}
declare -A url=([direct]="http://$upstream" [router]="http://127.0.0.1:$rport" [nginx]="http://127.0.0.1:$nport")
# Whose CPU each run counts: the replica's nginx for direct, the proxy alone for the others.
upstream_pid=$(status | python3 -c '
import json, sys
m = {m["name"]: m for m in json.load(sys.stdin)["models"]}
print([x for x in m["bench"]["replicas"] if x["state"] == "routed"][0]["pid"])')
declare -A cpu_of=([direct]="$upstream_pid" [router]="$route_pid" [nginx]="$(cat "$dir/proxy.pid")")
results=$dir/results
: >"$results"
targets=(direct router nginx)
echo "machine: $(nproc) CPUs, $(cut -d' ' -f1-3 /proc/loadavg) load before the run; $rounds round(s) of ${secs}s per point"
for round in $(seq 1 "$rounds"); do
  for point in ${ROUTE_BENCH_POINTS:-1 64 256 64p 256p}; do
    c=${point%p}
    paced=
    [ "$point" != "$c" ] && paced=1
    # Rotate the order so that no target always runs first (or right after another).
    for k in 0 1 2; do
      name=${targets[$(((k + round) % 3))]}
      echo "$round $point $name $(run_wrk "${url[$name]}" "$c" "$paced" ${cpu_of[$name]})" >>"$results"
    done
  done
done
python3 - "$results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
points = [p for p in ("1", "64", "256", "64p", "256p") if any(r[1] == p for r in rows)]
label = {"1": "1", "64": "64", "256": "256", "64p": "64, paced", "256p": "256, paced"}
med = {}
for c in points:
    for t in ("direct", "router", "nginx"):
        xs = [r for r in rows if r[1] == c and r[2] == t]
        med[(c, t)] = tuple(statistics.median(float(r[i]) for r in xs) for i in (3, 4, 5, 6))
print()
print("CPU per request counts the target's own processes only (the replica's nginx for direct).")
print()
print("| clients | target | p50 | p99 | req/s | CPU/request | added p50 | added p99 |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for c in points:
    d = med[(c, "direct")]
    for t in ("direct", "router", "nginx"):
        p50, p99, rps, cpu = med[(c, t)]
        add = "" if t == "direct" else f"{p50 - d[0]:+.0f} µs"
        add99 = "" if t == "direct" else f"{p99 - d[1]:+.0f} µs"
        print(f"| {label[c]} | {t} | {p50:.0f} µs | {p99:.0f} µs | {rps:.0f} | {cpu:.1f} µs | {add} | {add99} |")
print()
for c in points:
    r, n = med[(c, "router")], med[(c, "nginx")]
    print(f"{label[c]} clients: router/nginx throughput {r[2] / n[2]:.2f}x; "
          f"added p50 router {r[0] - med[(c, 'direct')][0]:+.0f} µs, nginx {n[0] - med[(c, 'direct')][0]:+.0f} µs")
EOF

# Memory per queued request.
rss() { awk '/^VmRSS/{print $2}' "/proc/$route_pid/status"; }
base=$(rss)
cat >"$dir/slow.lua" <<'EOF'
wrk.method = "POST"
wrk.body   = '{"model":"slow","prompt":"Hello there","max_tokens":4}'
wrk.headers["Content-Type"] = "application/json"
EOF
wrk -t2 -c"$queued" -d60s --timeout 120s -s "$dir/slow.lua" "http://127.0.0.1:$rport/v1/completions" >/dev/null 2>&1 &
wrk_pid=$!
pids+=($wrk_pid)
depth=0
for _ in $(seq 1 300); do
  depth=$(curl -sf "http://127.0.0.1:$rport/metrics" | awk '$1=="hearth_route_queue_depth{model=\"slow\"}"{print $2}')
  [ "${depth:-0}" -ge $((queued - 1)) ] && break
  sleep 0.1
done
sleep 1
full=$(rss)
kill "$wrk_pid" 2>/dev/null || true
echo
echo "memory: router RSS $base KiB idle, $full KiB with $depth requests queued (and 1 at the replica):" \
  "$(((full - base) * 1024 / queued)) bytes per queued request, its client connection included"
