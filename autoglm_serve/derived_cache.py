"""Files autoglm-serve derives from a model's files and keeps between runs (today: the tokenizer
converted from a GGUF file, seconds of work at every start otherwise).

An entry is keyed by its sources' paths, sizes and modification times and by a salt that names
the code and library versions that derived it, so a changed file or upgrade derives it anew.
Entries are written whole to a temporary folder and renamed into place: processes starting at
once each derive it, one rename wins, nobody reads half an entry.

The folder: $AUTOGLM_SERVE_CACHE_DIR, else $XDG_CACHE_HOME/autoglm-serve, else
~/.cache/autoglm-serve. A folder that cannot be written leaves everything working, uncached.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def cache_root() -> Path:
    if os.environ.get("AUTOGLM_SERVE_CACHE_DIR"):
        return Path(os.environ["AUTOGLM_SERVE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "autoglm-serve"


def entry_path(kind: str, sources: list[Path], salt: str) -> Path:
    """Where the entry of `kind` derived from `sources` lives (present or not)."""
    digest = hashlib.sha256(salt.encode())
    for source in sources:
        stat = source.stat()
        digest.update(f"\0{source.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return cache_root() / kind / digest.hexdigest()[:32]


def publish(entry: Path, write: Callable[[Path], None]) -> bool:
    """Write the entry through write(folder) and move it into place; whether the entry is there
    now. A failure (read-only or full disk, a writer that raises) is logged and leaves no entry:
    the caller has its value."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    except OSError as exc:
        log.info("not caching %s: %s", entry, exc)
        return False
    try:
        write(staging)
        os.rename(staging, entry)
    except Exception as exc:   # another process published it first, or the disk refused
        if not entry.is_dir():
            log.info("not caching %s: %s", entry, exc)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry.is_dir()
