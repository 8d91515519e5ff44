#!/usr/bin/env bash
# Installs what the test suite needs and builds nothing of hearth's own:
#   scripts/test-deps.sh
# Debian packages the tests run (python3 with venv, util-linux's unshare/setsid/fincore/nsenter,
# procps's kill, diffutils, systemd-container for tests/under_systemd, haproxy and prometheus for
# tests/route/fleet.rs), llama.cpp's server with a tiny model (scripts/real-model.sh), the
# genuine llama-server built from source (scripts/llama-server.sh: 10–20 minutes on 2 cores the
# first time, cached after), a Python with the official openai client (PyPI), and cargo-nextest
# (crates.io). As root it installs the Debian packages; as another user it names what is missing
# and stops. Each part is skipped when it is already there, so a second run takes seconds:
# scripts/test.sh runs this first, and CI runs it as a step of its own before the test step.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
target=${CARGO_TARGET_DIR:-$repo/target}

# Debian packages, by the command each provides.
missing=()
need() { command -v "$1" >/dev/null || missing+=("$2"); }
need python3 python3
need unshare util-linux
need setsid util-linux
need fincore util-linux
need kill procps
need diff diffutils
need systemd-nspawn systemd-container
need nsenter util-linux
need haproxy haproxy
need prometheus prometheus
if command -v python3 >/dev/null && ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  missing+=(python3-venv)
fi
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test-deps.sh: missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "scripts/test-deps.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# llama.cpp's server and the tiny model (tests/real_model/serve.rs, scrape_llamacpp.rs, route_openai.rs).
scripts/real-model.sh "$target/real-model"
# The genuine llama-server, built from source once and cached (tests/real_model/sleep_llamacpp.rs).
scripts/llama-server.sh "$target/llama-server"

# The official openai client (tests/route/openai.rs).
venv=$target/openai-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# pip is asked again only when the pins changed (it takes seconds even when nothing is to do).
if ! cmp -s scripts/requirements-openai.txt "$venv/.pins"; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir -r scripts/requirements-openai.txt
  cp scripts/requirements-openai.txt "$venv/.pins"
fi

# The test runner.
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
