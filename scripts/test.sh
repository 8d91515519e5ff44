#!/usr/bin/env bash
# The test command: installs what the tests need, then runs the whole suite.
#   scripts/test.sh
# scripts/test-deps.sh installs what the suite needs (Debian packages as root, llama.cpp's server
# and a tiny model, the genuine llama-server built from source, the official openai client,
# cargo-nextest; see its header), then this runs
#   cargo nextest run --release --workspace --no-fail-fast --test-threads 12
# every crate's tests, the binaries' tests side by side, each test a process of its own.
# `cargo test --release --workspace` runs the same tests, one binary after another.
# Twelve at a time on any machine: most tests wait on real processes (cold starts, drains, a
# trace replayed at its own pace), not on the CPU. On 2 cores the whole suite then used 1.6 cores
# on average and took 115 s, its longest test 84 s (4 at a time: 318 s; 8: 172 s; tests/README.md).
# A test that cannot run here (not root, no writable cgroup v2, …) fails and says what is
# missing; HEARTH_ALLOW_SKIP=1 makes such tests pass with a note instead, for a developer's
# machine only: CI never sets it.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
target=${CARGO_TARGET_DIR:-$repo/target}

scripts/test-deps.sh
export HEARTH_REAL_MODEL_DIR=$target/real-model
export HEARTH_LLAMA_SERVER=$target/llama-server/llama-server
export HEARTH_OPENAI_PYTHON=$target/openai-venv/bin/python

exec cargo nextest run --release --workspace --no-fail-fast --test-threads 12
