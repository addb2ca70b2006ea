"""A small OpenAI-compatible server on loopback for probe tests, with failure modes."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = (
    "good",
    "slow_first_byte",
    "invalid_json",
    "empty_text",
    "model_not_found",
    "context_length",
    "http500",
    "dropped_stream",
    "slow_once",
)


class JsonHandler(BaseHTTPRequestHandler):
    """What the loopback stubs' handlers share: HTTP/1.1, quiet, one way to send a body."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class LoopbackServer:
    """A threading HTTP server on a free loopback port, serving while the `with` lasts."""

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):  # type: ignore[no-untyped-def]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class Stub(LoopbackServer):
    def __init__(self, mode: str = "good", delay: float = 0.0, first_byte: float = 0.0, pace: float = 0.005):
        """`first_byte` and `pace` (seconds before a response, between streamed pieces) make timings
        steady enough to compare two runs: a bare loopback answer is a few noisy milliseconds."""
        self.mode = mode
        self.delay = delay
        self.first_byte = first_byte
        self.pace = pace
        self.requests = 0
        stub = self

        class Handler(JsonHandler):
            def _unauthorised(self) -> bool:
                """mode "auth": only `Authorization: Bearer sk-test-key` gets in (as vLLM --api-key)."""
                if stub.mode == "auth" and self.headers.get("Authorization") != "Bearer sk-test-key":
                    self._send(401, b'{"error":"Unauthorized"}')
                    return True
                return False

            def do_GET(self) -> None:
                if self._unauthorised():
                    return
                if self.path == "/v1/models":
                    self._send(
                        200,
                        json.dumps(
                            {
                                "object": "list",
                                "data": [{"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model"}],
                            }
                        ).encode(),
                    )
                else:
                    self._send(404, b'{"detail":"Not Found"}')

            def do_POST(self) -> None:
                if self._unauthorised():
                    return
                stub.requests += 1
                time.sleep(stub.first_byte)
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n) or b"{}")
                mode = stub.mode
                if (mode == "slow_once" and stub.requests == 1) or mode == "slow_first_byte":
                    time.sleep(stub.delay)
                if mode == "invalid_json":
                    return self._send(200, b"<html>502 Bad Gateway</html>", "text/html")
                if mode == "model_not_found":
                    return self._send(
                        404,
                        json.dumps(
                            {
                                "object": "error",
                                "message": f"The model `{req.get('model')}` does not exist.",
                                "type": "NotFoundError",
                                "code": 404,
                            }
                        ).encode(),
                    )
                if mode == "context_length":
                    return self._send(
                        400,
                        json.dumps(
                            {
                                "object": "error",
                                "message": "This model's maximum context "
                                "length is 4096 tokens. However, you requested 5000 tokens.",
                                "type": "BadRequestError",
                                "code": 400,
                            }
                        ).encode(),
                    )
                if mode == "http500":
                    return self._send(500, b"Internal Server Error", "text/plain")
                text = "" if mode == "empty_text" else "你好！有什么可以帮你的吗？"
                pieces = ["你好", "！", "有什么", "可以", "帮你的", "吗", "？"] if text else []
                if not req.get("stream"):
                    usage = {
                        "prompt_tokens": 2,
                        "completion_tokens": len(pieces),
                        "total_tokens": 2 + len(pieces),
                    }
                    body = {
                        "id": "cmpl-1",
                        "object": "text_completion",
                        "model": req.get("model"),
                        "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                        "usage": usage,
                    }
                    return self._send(200, json.dumps(body, ensure_ascii=False).encode())
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i, p in enumerate(pieces):
                    if mode == "dropped_stream" and i == 3:
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        return
                    ev = {"choices": [{"index": 0, "text": p, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(ev, ensure_ascii=False)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(stub.pace)
                usage = {
                    "prompt_tokens": 2,
                    "completion_tokens": len(pieces),
                    "total_tokens": 2 + len(pieces),
                }
                self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self._serve(Handler)
