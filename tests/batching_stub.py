"""An OpenAI-compatible server on loopback that batches like an engine, for the sweep tests.

A fixed number of slots (the running batch); a request beyond them waits in a queue; every
token of every running request takes `base_s × (1 + alpha × running)` (a bigger batch makes
each step slower), so throughput grows with concurrency until the slots are full and then
stops while the queue makes latency climb: the knee is at `slots`. `/metrics` speaks vLLM's
Prometheus names; `limit` says whether a full batch shows as a full KV cache (`kv`) or as a
cap with KV to spare (`scheduler`).
"""

from __future__ import annotations

import json
import threading
import time

from .openai_stub import JsonHandler, LoopbackServer


class BatchingStub(LoopbackServer):
    def __init__(
        self,
        slots: int = 4,
        base_s: float = 0.004,
        alpha: float = 0.05,
        limit: str = "kv",
        names: dict[str, str] | None = None,
    ):
        self.slots = slots
        self.base_s = base_s
        self.alpha = alpha
        self.limit = limit
        self.names = names
        self.slow = 1.0  # multiplies every delay: a regression after an "upgrade"
        self.text = "tok"  # the words it answers with: changes when the "kernels" change
        self.repeat = False  # answer one word again and again (a broken kernel's loop)
        self.max_model_len = 4096  # a prompt longer than this (one token a word) is refused, as vLLM does
        self.last_prompt_tokens = 0
        self.running = 0
        self.waiting = 0
        self.requests = 0
        self._sem = threading.Semaphore(slots)
        self._lock = threading.Lock()
        stub = self

        class Handler(JsonHandler):
            disable_nagle_algorithm = True  # tokens leave one by one, as an engine's do

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(
                        200,
                        json.dumps(
                            {"data": [{"id": "stub-model", "max_model_len": stub.max_model_len}]}
                        ).encode(),
                    )
                elif self.path == "/metrics":
                    self._send(200, stub.metrics().encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b"{}")

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                req = json.loads(self.rfile.read(n) or b"{}")
                max_tokens = int(req.get("max_tokens") or 16)
                prompt_tokens = len(str(req.get("prompt") or req.get("messages") or "").split())
                stub.last_prompt_tokens = prompt_tokens
                if prompt_tokens + max_tokens > stub.max_model_len:
                    msg = (
                        f"This model's maximum context length is {stub.max_model_len} tokens. However, you "
                        f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                        f"{max_tokens} in the completion). Please reduce the length of the messages or completion."
                    )
                    err = {
                        "object": "error",
                        "message": msg,
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                    self._send(400, json.dumps(err).encode())
                    return
                with stub._lock:
                    stub.requests += 1
                    stub.waiting += 1
                stub._sem.acquire()
                with stub._lock:
                    stub.waiting -= 1
                    stub.running += 1
                try:
                    if not req.get("stream"):
                        text = " ".join(stub.word(i) for i in range(max_tokens))
                        for _ in range(max_tokens):
                            stub._step()
                        body = {
                            "id": "cmpl-1",
                            "object": "text_completion",
                            "model": "stub-model",
                            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                            "usage": {
                                "prompt_tokens": 3,
                                "completion_tokens": max_tokens,
                                "total_tokens": max_tokens + 3,
                            },
                        }
                        self._send(200, json.dumps(body).encode())
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for i in range(max_tokens):
                        stub._step()
                        ev = {"choices": [{"index": 0, "text": f"{stub.word(i)} ", "finish_reason": None}]}
                        self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
                        self.wfile.flush()
                    usage = {
                        "prompt_tokens": 3,
                        "completion_tokens": max_tokens,
                        "total_tokens": max_tokens + 3,
                    }
                    self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                    self.close_connection = True
                finally:
                    with stub._lock:
                        stub.running -= 1
                    stub._sem.release()

        self._serve(Handler)

    def word(self, i: int) -> str:
        return self.text if self.repeat else f"{self.text}{i}"

    def _step(self) -> None:
        time.sleep(self.slow * self.base_s * (1 + self.alpha * self.running))

    def metrics(self) -> str:
        share = self.running / self.slots
        kv = share * (0.99 if self.limit == "kv" else 0.3)
        if self.names:  # another engine's sample names (a profile's `metrics:`), no labels
            values = {"running": float(self.running), "waiting": float(self.waiting), "kv_usage": kv}
            return "".join(f"{self.names[k]} {v}\n" for k, v in values.items() if k in self.names)
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="stub-model"}} {float(self.running)}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="stub-model"}} {float(self.waiting)}\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="stub-model"}} {kv}\n'
            "# TYPE vllm:num_preemptions_total counter\n"
            'vllm:num_preemptions_total{engine="0",model_name="stub-model"} 0.0\n'
        )
