"""`--model owner/name` as vLLM takes it (Open-AutoGLM's command line names
zai-org/AutoGLM-Phone-9B): found in the Hugging Face cache, here one laid out as the Hub's
clients write it and read by huggingface_hub itself offline, then served like a local
checkpoint; so are `--tokenizer owner/name` and llama.cpp's `owner/name-GGUF:QUANT`; a name in
no cache says so."""
from __future__ import annotations

import shutil

import httpx
import pytest
from huggingface_hub import constants

from autoglm_serve.loader import default_model_path
from autoglm_serve.loader.hub import pick_gguf
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


@pytest.fixture(scope="module")
def gguf_cache(tmp_path_factory):
    """A llama.cpp-style GGUF repository in the cache: two quantizations (one of them the
    embedded default's real Q4_1 file) and two mmproj precisions."""
    cache = tmp_path_factory.mktemp("hf-gguf-cache")
    repo = cache / "models--acme--smol-GGUF"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "SmolLM2-135M-Instruct-Q4_1.gguf").symlink_to(default_model_path())
    for name in ("SmolLM2-135M-Instruct-Q8_0.gguf", "mmproj-F32.gguf", "mmproj-F16.gguf"):
        (snapshot / name).write_bytes(b"not read")
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


def test_a_gguf_quantization_named_as_llama_cpp_does(gguf_cache, offline):
    resolved = resolve_model_path("acme/smol-GGUF:q4_1", download_dir=str(gguf_cache))
    assert resolved.format == "gguf" and resolved.path.name == "SmolLM2-135M-Instruct-Q4_1.gguf"
    assert resolved.config.model_type == "llama" and resolved.mmproj is None  # a text model
    with pytest.raises(ValueError, match=r"no GGUF file of 'Q5_K_M'.*Q4_1.gguf.*Q8_0.gguf"):
        resolve_model_path("acme/smol-GGUF:Q5_K_M", download_dir=str(gguf_cache))
    with pytest.raises(ValueError, match=r"name the quantization .*acme/smol-GGUF:Q4_K_M"):
        resolve_model_path("acme/smol-GGUF", download_dir=str(gguf_cache))
    with pytest.raises(FileNotFoundError, match=r'hf download acme/big-GGUF --include "\*Q4_K_M'):
        resolve_model_path("acme/big-GGUF:Q4_K_M", download_dir=str(gguf_cache))


def test_of_several_mmproj_files_the_f16_one_is_taken():
    files = ["M-Q4_K_M.gguf", "M-Q8_0.gguf", "mmproj-M-F32.gguf", "mmproj-M-BF16.gguf",
             "mmproj-M-F16.gguf", "README.md"]
    assert pick_gguf(files, "Q4_K_M", "x") == ("M-Q4_K_M.gguf", "mmproj-M-F16.gguf")
    assert pick_gguf(files[:2] + ["mmproj-M-F32.gguf"], "q8_0", "x") == \
        ("M-Q8_0.gguf", "mmproj-M-F32.gguf")
    assert pick_gguf(files[:2], "Q8_0", "x") == ("M-Q8_0.gguf", None)


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
