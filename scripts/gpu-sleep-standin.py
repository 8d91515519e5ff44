#!/usr/bin/env python3
"""gpu-sleep-standin.py: a model server stand-in with vLLM's sleep endpoints that frees and
restores a real device allocation, for scripts/gpu-smoke.sh on a host without vLLM.

It holds `--gib` GiB on the device (PyTorch, else CuPy), filled with a pattern, and serves:
  POST /v1/completions   an OpenAI-shaped answer once the pattern reads back (503 asleep)
  GET  /health           200
  POST /sleep?level=N    level 1: the allocation is copied to host RAM, then freed on the
                         device; level 2: freed only. The allocator's cache is emptied, so
                         NVML sees the memory go.
  POST /wake_up          the allocation is made again (from the host copy at level 1)
  GET  /is_sleeping      {"is_sleeping":true|false}, compact, as hearth's vLLM preset reads it

`--device cpu` holds a plain host buffer instead: the endpoints and their order can be checked
on a machine without a GPU (the smoke itself never uses it).

Usage: gpu-sleep-standin.py --port P [--host 127.0.0.1] [--gib 4] [--device cuda|cpu]
"""

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PATTERN = 7


class Cpu:
    """A host buffer standing in for device memory (`--device cpu`)."""

    def alloc(self, n):
        return bytearray([PATTERN]) * n

    def to_host(self, x):
        return bytes(x)

    def from_host(self, h):
        return bytearray(h)

    def first(self, x):
        return x[0]

    def release(self):
        pass


class Torch:
    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch sees no CUDA device")
        self.t = torch

    def alloc(self, n):
        x = self.t.empty(n, dtype=self.t.uint8, device="cuda")
        x.fill_(PATTERN)
        self.t.cuda.synchronize()
        return x

    def to_host(self, x):
        return x.cpu()

    def from_host(self, h):
        x = h.to("cuda")
        self.t.cuda.synchronize()
        return x

    def first(self, x):
        return int(x[0].item())

    def release(self):
        # Freed tensors stay in PyTorch's cache, where NVML still counts them.
        self.t.cuda.synchronize()
        self.t.cuda.empty_cache()


class Cupy:
    def __init__(self):
        import cupy

        self.c = cupy

    def alloc(self, n):
        x = self.c.empty(n, dtype=self.c.uint8)
        x.fill(PATTERN)
        self.c.cuda.Device().synchronize()
        return x

    def to_host(self, x):
        return x.get()

    def from_host(self, h):
        return self.c.asarray(h)

    def first(self, x):
        return int(x[0])

    def release(self):
        self.c.get_default_memory_pool().free_all_blocks()


def backend(device):
    if device == "cpu":
        return Cpu()
    try:
        return Torch()
    except ImportError:
        return Cupy()


class State:
    def __init__(self, dev, n):
        self.dev, self.n = dev, n
        self.lock = threading.Lock()
        self.x = dev.alloc(n)
        self.host = None

    def asleep(self):
        return self.x is None

    def sleep(self, level):
        with self.lock:
            if self.x is None:
                return
            self.host = self.dev.to_host(self.x) if level == 1 else None
            self.x = None
            self.dev.release()

    def wake(self):
        with self.lock:
            if self.x is not None:
                return
            self.x = self.dev.alloc(self.n) if self.host is None else self.dev.from_host(self.host)
            self.host = None

    def intact(self):
        with self.lock:
            return self.x is not None and self.dev.first(self.x) == PATTERN


def handler(state):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def answer(self, code, body):
            data = json.dumps(body, separators=(",", ":")).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def body(self):
            n = min(int(self.headers.get("content-length") or 0), 1 << 20)
            return self.rfile.read(n)

        def do_GET(self):
            path = urlparse(self.path).path
            if path == "/health":
                self.answer(200, {})
            elif path == "/is_sleeping":
                self.answer(200, {"is_sleeping": state.asleep()})
            else:
                self.answer(404, {"error": "not found"})

        def do_POST(self):
            url = urlparse(self.path)
            self.body()
            if url.path == "/sleep":
                level = parse_qs(url.query).get("level", ["1"])[0]
                if level not in ("1", "2"):
                    self.answer(400, {"error": f"level {level!r}: 1 or 2"})
                    return
                state.sleep(int(level))
                self.answer(200, {})
            elif url.path == "/wake_up":
                state.wake()
                self.answer(200, {})
            elif url.path == "/v1/completions":
                if not state.intact():
                    self.answer(503, {"error": "asleep, or the weights did not come back"})
                    return
                self.answer(200, {"choices": [{"index": 0, "text": " ok"}]})
            else:
                self.answer(404, {"error": "not found"})

    return H


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--gib", type=float, default=4.0)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = p.parse_args()
    if not 0 < a.gib <= 1024:
        sys.exit("gpu-sleep-standin: --gib must be in (0, 1024]")
    try:
        state = State(backend(a.device), int(a.gib * (1 << 30)))
    except Exception as e:  # no PyTorch or CuPy, or no device: say which, and exit
        sys.exit(f"gpu-sleep-standin: cannot hold device memory: {e}")
    server = ThreadingHTTPServer((a.host, a.port), handler(state))
    print(f"gpu-sleep-standin: {a.gib} GiB on {a.device}, listening on {a.host}:{a.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
