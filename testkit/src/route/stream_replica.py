#!/usr/bin/env python3
"""A stand-in model server that streams, for the front door's tests (standard library only).

POST /v1/completions and /v1/chat/completions answer in the OpenAI shape; with "stream": true
they answer as server-sent events, one chunk per event, written and flushed one at a time.
A request may steer the answer with a "test" object in its body (the router passes the body on):
  "chunks": N        events before [DONE] (default 3)
  "gate": PATH       after the first event, wait until PATH exists before the rest
  "delay_ms": D      pause between events
GET /health answers 200; GET /stats answers {"requests": N} (completion requests received).
"""
import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
args = ap.parse_args()

lock = threading.Lock()
received = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *a):
        pass

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/stats":
            with lock:
                self.send_json(200, {"requests": received})
        else:
            self.send_json(404, {"error": "not found"})

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        global received
        n = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(n) or b"{}")
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self.send_json(404, {"error": "not found"})
            return
        with lock:
            received += 1
        chat = self.path == "/v1/chat/completions"
        test = body.get("test") or {}
        model = body.get("model", "")
        if not body.get("stream"):
            choice = {"index": 0, "finish_reason": "stop"}
            if chat:
                choice["message"] = {"role": "assistant", "content": "stand-in"}
            else:
                choice["text"] = " stand-in"
            self.send_json(200, {"id": "s-1", "object": "chat.completion" if chat else
                                 "text_completion", "created": int(time.time()),
                                 "model": model, "choices": [choice]})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = int(test.get("chunks", 3))
        for i in range(chunks):
            if i == 1 and test.get("gate"):
                while not os.path.exists(test["gate"]):
                    time.sleep(0.01)
            if i > 0 and test.get("delay_ms"):
                time.sleep(test["delay_ms"] / 1000)
            if chat:
                choice = {"index": 0, "delta": {"content": f"part{i} "}, "finish_reason": None}
            else:
                choice = {"index": 0, "text": f"part{i} ", "finish_reason": None}
            ev = {"id": "s-1", "object": "chat.completion.chunk" if chat else "text_completion",
                  "created": int(time.time()), "model": model, "choices": [choice]}
            self.chunk(b"data: " + json.dumps(ev).encode() + b"\n\n")
        self.chunk(b"data: [DONE]\n\n")
        self.chunk(b"")


server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
server.daemon_threads = True
print(f"stream replica listening on {args.port}", flush=True)
server.serve_forever()
