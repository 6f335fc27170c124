"""`--model owner/name` as vLLM takes it (Open-AutoGLM's command line names
zai-org/AutoGLM-Phone-9B): found in the Hugging Face cache, here one laid out as the Hub's
clients write it and read by huggingface_hub itself offline, then served like a local
checkpoint; so is `--tokenizer owner/name`; a name in no cache says so."""
from __future__ import annotations

import shutil

import httpx
import pytest
from huggingface_hub import constants

from autoglm_serve.loader.model_path import resolve_model_path
from autoglm_serve.tokenizer import load_tokenizer
from tests.server_fixtures import ServerProcess
from tests.tiny_llama import build_tiny_llama

REPO = "acme/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A Hugging Face cache holding REPO at COMMIT, `main` pointing there."""
    cache = tmp_path_factory.mktemp("hf-cache")
    repo = cache / "models--acme--tiny-llama"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(build_tiny_llama(tmp_path_factory.mktemp("tiny")), snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cache


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_a_hub_id_resolves_to_its_cached_snapshot(hub_cache, offline):
    for revision in (None, "main", COMMIT):
        resolved = resolve_model_path(REPO, revision=revision, download_dir=str(hub_cache))
        assert resolved.path == hub_cache / "models--acme--tiny-llama" / "snapshots" / COMMIT
        assert resolved.format == "safetensors" and resolved.config.model_type == "llama"
    assert resolve_model_path(REPO, download_dir=str(hub_cache), download=False).path == \
        resolved.path     # as `doctor` looks: the cache only


def test_a_hub_id_in_no_cache_says_where_it_looked(hub_cache, offline):
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        resolve_model_path("acme/absent", download_dir=str(hub_cache))
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache at revision 'v2'"):
        resolve_model_path(REPO, revision="v2", download_dir=str(hub_cache))
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache .only the cache"):
        resolve_model_path("acme/absent", download_dir=str(hub_cache), download=False)
    # a bare name is a local path that is not there, not a Hub lookup
    with pytest.raises(FileNotFoundError, match="unknown model path 'tiny-llama'"):
        resolve_model_path("tiny-llama", download_dir=str(hub_cache))


def test_a_tokenizer_named_by_hub_id_comes_from_the_cache(hub_cache, offline, tmp_path):
    """vLLM's `--tokenizer owner/name` beside a model whose own tokenizer is not wanted."""
    tokenizer = load_tokenizer(tmp_path, REPO, download_dir=str(hub_cache))
    assert tokenizer("tap the home button")["input_ids"] and tokenizer.chat_template


def test_the_server_serves_a_hub_id_from_the_cache(hub_cache):
    server = ServerProcess([REPO, "--download-dir", str(hub_cache), "--max-model-len", "256",
                            "--dtype", "float32", "--kv-cache-memory-gib", "0.02"],
                           env={"HF_HUB_OFFLINE": "1"})
    server.start()
    try:
        assert [m["id"] for m in httpx.get(server.url("/v1/models")).json()["data"]] == [REPO]
        r = httpx.post(server.url("/v1/chat/completions"), timeout=60, json={
            "model": REPO, "messages": [{"role": "user", "content": "tap the home button"}],
            "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        server.stop()
