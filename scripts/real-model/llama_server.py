#!/usr/bin/env python3
"""`llama-server` for tests: llama.cpp's own C++ HTTP server, run inside this process through the
prebuilt `xllamacpp` wheel (no compiler needed). It takes the llama-server flags the tests use and
refuses any other, so that a test never relies on a flag that would silently do nothing here.

Endpoints are llama.cpp's: GET /health (503 while loading), POST /completion,
/v1/completions, /v1/chat/completions (streaming too), GET /v1/models, and with --metrics
GET /metrics (`llamacpp:requests_processing`, `llamacpp:requests_deferred`, …).
"""
import argparse
import signal

import xllamacpp


def flags():
    p = argparse.ArgumentParser(prog="llama-server", allow_abbrev=False)
    p.add_argument("-m", "--model", required=True, help="the GGUF file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-c", "--ctx-size", type=int, default=2048, help="the model's whole context")
    p.add_argument("-np", "--parallel", type=int, default=1, help="slots")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--metrics", action="store_true", help="serve GET /metrics")
    p.add_argument("--embeddings", action="store_true", help="serve /v1/embeddings")
    return p.parse_args()


def main():
    a = flags()
    params = xllamacpp.CommonParams()
    params.model.path = a.model
    params.hostnames = [a.host]
    params.port = a.port
    params.n_ctx = a.ctx_size
    params.n_parallel = a.parallel
    params.cpuparams.n_threads = a.threads
    params.cpuparams_batch.n_threads = a.threads
    params.endpoint_metrics = a.metrics
    params.embedding = a.embeddings
    params.n_gpu_layers = 0

    # SIGTERM is how hearth stops a replica. Blocked before the server starts its threads (they
    # inherit the mask), so that none of them takes it; this thread waits for it, then lets the
    # server go (its destructor stops the listener and frees the model) and exits 0.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    server = xllamacpp.Server(params)  # loads the model, then listens
    print("llama-server (xllamacpp) listening on %s" % server.listening_address, flush=True)
    signal.sigwait(stop)
    del server


if __name__ == "__main__":
    main()
