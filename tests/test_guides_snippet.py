"""The deployment guides' LangChain snippet on the embedded default: ChatOpenAI without
max_tokens, ten ainvoke("你好") at once. It must come back in seconds, which the embedded
model's default max_tokens (loader/default_model.py) makes so; the start-up log says it."""
from __future__ import annotations

import asyncio
import time

from autoglm_serve.loader.default_model import DEFAULT_MAX_NEW_TOKENS

BUDGET_S = 60.0   # the bound; ~15 s on a 2-core CPU shared with other work


def test_ten_concurrent_ainvoke_without_max_tokens_return(embedded_server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=embedded_server.base_url + "/v1", api_key="none",
                     model="SmolLM2-135M-Instruct", timeout=BUDGET_S)

    async def ten():
        return await asyncio.gather(*(llm.ainvoke("你好") for _ in range(10)))

    start = time.monotonic()
    replies = asyncio.run(ten())
    elapsed = time.monotonic() - start
    assert elapsed < BUDGET_S
    used = [r.response_metadata["token_usage"]["completion_tokens"] for r in replies]
    assert all(0 < n <= DEFAULT_MAX_NEW_TOKENS for n in used), used
    assert all(r.content for r in replies)
    assert (f"default max_tokens (requests without one): {DEFAULT_MAX_NEW_TOKENS}"
            in embedded_server.log(tail=10**6))


def test_offline_default_params_carry_the_default_max_tokens(default_llm):
    assert default_llm.get_default_sampling_params().max_tokens == DEFAULT_MAX_NEW_TOKENS
