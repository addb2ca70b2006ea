#!/usr/bin/env python3
"""Generate a large realistic vLLM V1 log: multi-rank startup, request and stats lines for
SIZE bytes, then a runtime OOM near the end. Usage: gen_log.py OUT SIZE_MB"""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))

from build_logs import VLLM, torch_oom, vllm_v1  # noqa: E402


def main() -> None:
    out, size_mb = Path(sys.argv[1]), int(sys.argv[2])
    target = size_mb * 1024 * 1024
    rnd = random.Random(7)
    start = vllm_v1("ready", tp=4, ansi=True, model="meta-llama/Llama-3.1-70B-Instruct")
    api = "\x1b[1;36m(APIServer pid=2107)\x1b[0;0m "
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(start.lines) + "\n")
        written = f.tell()
        t = 6 * 3600 + 30 * 60
        chunk: list[str] = []
        while written < target - 4096:
            t += 1
            hms = f"{t // 3600 % 24:02d}:{t % 3600 // 60:02d}:{t % 60:02d}"
            for _ in range(8):
                port = rnd.randint(30000, 60000)
                chunk.append(
                    f"{api}INFO:     10.0.{rnd.randint(0, 9)}.{rnd.randint(2, 250)}:{port} - "
                    f'"POST /v1/chat/completions HTTP/1.1" 200 OK'
                )
            chunk.append(
                f"{api}INFO 06-05 {hms} [logger.py:43] Received request chatcmpl-{rnd.getrandbits(64):016x}: "
                f"prompt: None, params: SamplingParams(n=1, temperature=0.7, top_p=0.95, max_tokens=512), "
                f"prompt_token_ids: None, lora_request: None."
            )
            chunk.append(
                f"{api}INFO 06-05 {hms} [loggers.py:123] Engine 000: Avg prompt throughput: "
                f"{rnd.uniform(100, 4000):.1f} tokens/s, Avg generation throughput: {rnd.uniform(100, 900):.1f} "
                f"tokens/s, Running: {rnd.randint(1, 64)} reqs, Waiting: 0 reqs, GPU KV cache usage: "
                f"{rnd.uniform(1, 60):.1f}%, Prefix cache hit rate: {rnd.uniform(0, 80):.1f}%"
            )
            if len(chunk) > 2000:
                data = "\n".join(chunk) + "\n"
                f.write(data)
                written += len(data.encode())
                chunk = []
        core = "(EngineCore_0 pid=2311) ERROR 06-05 23:59:59 [core.py:702] "
        f.write(
            core
            + "EngineCore encountered a fatal error.\n"
            + core
            + "Traceback (most recent call last):\n"
            + core
            + f'  File "{VLLM}/v1/worker/gpu_model_runner.py", line 1620, in execute_model\n'
            + core
            + "    model_output = self.model(\n"
            + core
            + torch_oom()
            + "\n"
        )


if __name__ == "__main__":
    main()
