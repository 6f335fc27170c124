"""`autoglm-serve serve --quantization fp8 --kv-cache-dtype fp8` on the embedded SmolLM2 (real
weights, FP8 at load, an fp8 KV cache): the start-up report says what was chosen and the real
openai client gets a right answer."""
from __future__ import annotations

import openai

from tests.server_fixtures import server_fixture


def test_fp8_server_answers_a_chat_request():
    for server in server_fixture(["--quantization", "fp8", "--kv-cache-dtype", "fp8",
                                  "--max-model-len", "1024"]):
        client = openai.OpenAI(base_url=server.url("/v1"), api_key="EMPTY", timeout=300)
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, temperature=0, max_tokens=12,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in reply.choices[0].message.content
        log = server.log(tail=10**6)
        assert "quantization: fp8: FP8 W8A8" in log and "quantized at load" in log
        assert "KV cache dtype: float8_e4m3fn" in log
