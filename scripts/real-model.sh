#!/usr/bin/env bash
# Prepares the real model server the tests drive: llama.cpp's HTTP server (the prebuilt xllamacpp
# wheel, from PyPI) and a tiny deterministic GGUF model generated here (scripts/real-model/).
# Needs python3 with venv and the Python package index; nothing else is downloaded.
#   scripts/real-model.sh [DIR]        (default: target/real-model; about 20 s and 210 MB)
# Leaves in DIR: venv/, tiny-llama.gguf, and llama-server, a launcher that takes llama-server's
# flags -m --host --port -c -np -t --metrics --embeddings. DIR is self-contained: it can be used
# from a copy of the repository elsewhere (HEARTH_REAL_MODEL_DIR=DIR). Running it again does only
# what changed (new pins, a changed generator or server), so it is cheap to call before tests.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/../target/real-model}
# The versions the tests were written against: a newer llama.cpp may answer differently.
pins=(xllamacpp==2026.10.11549 gguf==0.19.0)

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
say() { printf 'real-model: %s\n' "$*"; }

if [ ! -x "$dir/venv/bin/python" ]; then
  say "creating $dir/venv"
  python3 -m venv "$dir/venv" || {
    echo "real-model: python3 -m venv failed; on Debian: apt-get install python3-venv" >&2
    exit 1
  }
fi
if [ "$(cat "$dir/venv/.pins" 2>/dev/null)" != "${pins[*]}" ]; then
  say "installing ${pins[*]}"
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir "${pins[@]}"
  printf '%s' "${pins[*]}" >"$dir/venv/.pins"
fi

# The model: regenerated whenever the generator (or the gguf pin) changed.
stamp="$(sha256sum "$here/real-model/tiny_gguf.py" | cut -d' ' -f1) ${pins[*]}"
if [ ! -f "$dir/tiny-llama.gguf" ] || [ "$(cat "$dir/tiny-llama.stamp" 2>/dev/null)" != "$stamp" ]; then
  "$dir/venv/bin/python" "$here/real-model/tiny_gguf.py" "$dir/tiny-llama.gguf.new"
  mv "$dir/tiny-llama.gguf.new" "$dir/tiny-llama.gguf"
  printf '%s' "$stamp" >"$dir/tiny-llama.stamp"
fi

install -m 0644 "$here/real-model/llama_server.py" "$dir/llama_server.py"
cat >"$dir/llama-server.new" <<LAUNCH
#!/bin/sh
# Written by scripts/real-model.sh: llama.cpp's server through xllamacpp.
exec "$dir/venv/bin/python" "$dir/llama_server.py" "\$@"
LAUNCH
chmod 0755 "$dir/llama-server.new"
mv "$dir/llama-server.new" "$dir/llama-server"

# A check that it serves: start it on a free port, ask for 4 tokens, stop it.
port=$("$dir/venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$dir/llama-server" -m "$dir/tiny-llama.gguf" --port "$port" >"$dir/check.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
ask='import json, sys, urllib.request as u
r = u.Request("http://127.0.0.1:%s/completion" % sys.argv[1], headers={"content-type": "application/json"},
              data=json.dumps({"prompt": "hello", "n_predict": 4, "ignore_eos": True}).encode())
print(json.load(u.urlopen(r, timeout=30))["tokens_predicted"])'
answer=
for _ in $(seq 1 100); do
  answer=$("$dir/venv/bin/python" -c "$ask" "$port" 2>/dev/null) && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
trap - EXIT
if [ "$answer" != 4 ]; then
  echo "real-model: the server did not answer a 4-token completion; its log:" >&2
  cat "$dir/check.log" >&2
  exit 1
fi
say "ready: $dir/llama-server -m $dir/tiny-llama.gguf --port PORT (4 tokens answered)"
