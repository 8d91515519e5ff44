#!/usr/bin/env bash
# The test command: installs what the tests need, then runs the whole suite.
#   scripts/test.sh
# On a fresh Debian machine, as root (as CI runs it), it installs the Debian packages the tests run
# (python3 with venv, util-linux's unshare/setsid/fincore, procps's kill, diffutils, haproxy and
# prometheus for tests/route/fleet.rs); as another
# user it names what is missing and stops. Then it prepares llama.cpp's server with a tiny model
# (scripts/real-model.sh), the genuine llama-server built from source (scripts/llama-server.sh,
# 10–20 minutes the first time, cached after) and a Python with the official openai client (PyPI), and runs
#   cargo nextest run --release --workspace --no-fail-fast --test-threads 4
# (cargo-nextest, installed from crates.io where the machine lacks it): every crate's tests, the
# binaries' tests side by side, each test a process of its own. `cargo test --release
# --workspace` runs the same tests, one binary after another.
# A test that cannot run here (not root, no writable cgroup v2, …) fails and says what is
# missing; HEARTH_ALLOW_SKIP=1 makes such tests pass with a note instead, for a developer's
# machine only: CI never sets it.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
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
    echo "scripts/test.sh: missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "scripts/test.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# llama.cpp's server and the tiny model (tests/real_model/serve.rs, scrape_llamacpp.rs, route_openai.rs).
scripts/real-model.sh "$target/real-model"
export HEARTH_REAL_MODEL_DIR=$target/real-model
# The genuine llama-server, built from source once and cached (tests/real_model/sleep_llamacpp.rs).
scripts/llama-server.sh "$target/llama-server"
export HEARTH_LLAMA_SERVER=$target/llama-server/llama-server

# The official openai client (tests/route/openai.rs).
venv=$target/openai-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir -r scripts/requirements-openai.txt
export HEARTH_OPENAI_PYTHON=$venv/bin/python

# cargo-nextest runs the test binaries side by side rather than one after another: most tests
# wait on real processes, so the suite takes about the time of its longest tests, not their sum.
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
exec cargo nextest run --release --workspace --no-fail-fast --test-threads 4
