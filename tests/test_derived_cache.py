"""The derived-files cache: keyed by its sources, written whole, never in the way."""
from __future__ import annotations

import os
import shutil

import pytest

from autoglm_serve.derived_cache import cache_root, entry_path, publish
from autoglm_serve.loader import default_model_path
from autoglm_serve.tokenizer import load_tokenizer


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("AUTOGLM_SERVE_CACHE_DIR", str(root))
    return root


def test_the_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOGLM_SERVE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "autoglm-serve"
    monkeypatch.setenv("AUTOGLM_SERVE_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_an_entry_is_keyed_by_its_sources_and_salt(cache, tmp_path):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"one")
    first = entry_path("kind", [source], "v1")
    assert first == entry_path("kind", [source], "v1")
    assert first != entry_path("kind", [source], "v2")
    source.write_bytes(b"other")           # a new size
    assert entry_path("kind", [source], "v1") != first
    os.utime(source, ns=(1, 1))            # same size, another modification time
    assert entry_path("kind", [source], "v1") != first
    copy = tmp_path / "copy.gguf"
    shutil.copy2(source, copy)
    assert entry_path("kind", [copy], "v1") != entry_path("kind", [source], "v1")


def test_publish_is_whole_or_nothing(cache):
    entry = cache / "kind" / "abc"

    def write_then_fail(folder):
        (folder / "half").write_text("x")
        raise RuntimeError("disk full")

    assert not publish(entry, write_then_fail)
    assert not entry.exists() and not any(entry.parent.iterdir())   # no staging left behind
    assert publish(entry, lambda folder: (folder / "a").write_text("first"))
    assert publish(entry, lambda folder: (folder / "a").write_text("second"))   # a later process
    assert (entry / "a").read_text() == "first"
    assert [p.name for p in entry.parent.iterdir()] == ["abc"]


def test_a_read_only_cache_leaves_loading_working(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("AUTOGLM_SERVE_CACHE_DIR", str(blocker / "cache"))
    tokenizer = load_tokenizer(default_model_path())
    assert tokenizer.decode(tokenizer.encode("Hello world")) == "Hello world"


def test_a_second_load_reads_the_cache_not_the_file(cache, tmp_path):
    source = tmp_path / "model.gguf"
    shutil.copy(default_model_path(), source)
    first = load_tokenizer(source)
    entries = list((cache / "gguf-tokenizer").iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()
    # The cache alone now answers: a file of the same identity whose metadata is unreadable
    stat = source.stat()
    with open(source, "r+b") as f:
        f.write(b"XXXX")                      # the GGUF magic, gone
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = load_tokenizer(source)
    assert again.encode("Open Settings 12345") == first.encode("Open Settings 12345")
    os.utime(source, ns=(1, 1))               # modified: converted again, and refused
    with pytest.raises(ValueError, match="GGUF"):
        load_tokenizer(source)
