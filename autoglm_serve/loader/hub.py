"""A model named by its Hugging Face Hub id (`--model zai-org/AutoGLM-Phone-9B`, as in
Open-AutoGLM's vLLM command line), or a GGUF repository's quantization in llama.cpp's `-hf`
form (`owner/name-GGUF:Q4_K_M`): found in the local Hugging Face cache or fetched into it (with
huggingface_hub's own progress bars), then served from there like any local checkpoint or
GGUF file. HF_HUB_OFFLINE=1 keeps to the cache; HF_TOKEN, HF_HOME and HF_HUB_CACHE apply as
for every Hugging Face tool."""
from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path

logger = logging.getLogger(__name__)

# config, generation config, tokenizer, chat template, image processor: what a checkpoint
# directory is read for, without its weights
CHECKPOINT_FILES = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
WEIGHT_FILES = ["*.safetensors"]
# an mmproj's precisions in the order taken when a repository has several (llama.cpp's
# repositories carry F16, BF16 and F32 copies of the same tower)
MMPROJ_PREFERENCE = ("f16", "bf16", "f32")
_TAG = re.compile(r"[A-Za-z0-9_.-]+")


def split_tag(name: str) -> tuple[str, str | None]:
    """`owner/name:Q4_K_M` -> ("owner/name", "Q4_K_M")."""
    repo, _, tag = name.partition(":")
    return repo, tag or None


def looks_like_repo_id(name: str) -> bool:
    """`owner/name`, optionally with a `:QUANT` tag, as the Hub spells ids (a bare name is more
    likely a mistyped local path)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    repo, tag = split_tag(name)
    if repo.count("/") != 1 or repo.startswith((".", "~")) or \
            (tag is not None and not _TAG.fullmatch(tag)):
        return False
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return False
    return True


def hub_path(name: str, revision: str | None = None, cache_dir: str | None = None,
             weights: bool = True, download: bool = True) -> Path | None:
    """Where `name` lies in the Hugging Face cache (fetch_from_hub) when it is no local path
    but reads as a Hub id; None when it is a local path, or no id (then a missing path)."""
    if Path(name).expanduser().exists() or not looks_like_repo_id(name):
        return None
    return fetch_from_hub(name, revision, cache_dir, weights, download)


def fetch_from_hub(name: str, revision: str | None = None, cache_dir: str | None = None,
                   weights: bool = True, download: bool = True) -> Path:
    """The local snapshot directory of the repository `name` (its safetensors too unless not
    weights: a model run with dummy weights needs only its config and tokenizer), or, for
    `owner/name:QUANT`, its one GGUF file of that quantization (with the repository's mmproj
    beside it). Without download, the cache only, as `doctor` looks. Raises
    FileNotFoundError (ValueError for a quantization the repository lacks) saying why."""
    from huggingface_hub import snapshot_download

    repo_id, tag = split_tag(name)
    with _hub_errors(repo_id, tag, revision, download):
        if tag is None:
            path = snapshot_download(
                repo_id, revision=revision, cache_dir=cache_dir, local_files_only=not download,
                allow_patterns=CHECKPOINT_FILES + (WEIGHT_FILES if weights else []))
        else:
            files = _repo_files(repo_id, revision, cache_dir, download)
            model, mmproj = pick_gguf(files, tag, name)
            path = Path(snapshot_download(
                repo_id, revision=revision, cache_dir=cache_dir, local_files_only=not download,
                allow_patterns=[model] + ([mmproj] if mmproj else []))) / model
    logger.info("%s%s: %s", name, f" at revision {revision!r}" if revision else "", path)
    return Path(path)


def pick_gguf(files: list[str], tag: str, name: str) -> tuple[str, str | None]:
    """The repository's one model GGUF whose file name holds the tag (any case), and its
    mmproj (the preferred precision) if it has any."""
    def is_mmproj(f: str) -> bool:
        return Path(f).name.lower().startswith("mmproj")

    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    models = [f for f in ggufs if not is_mmproj(f) and tag.lower() in Path(f).name.lower()]
    if len(models) != 1:
        available = [Path(f).name for f in ggufs if not is_mmproj(f)]
        raise ValueError(f"{name}: {'no' if not models else 'more than one'} GGUF file of "
                         f"{tag!r} in the repository; its model files: {available or 'none'}")
    mmprojs = [f for f in ggufs if is_mmproj(f)]
    def rank(f: str) -> int:
        precision = re.split(r"[-_.]", Path(f).stem.lower())[-1]    # mmproj-X-F16 -> f16
        return MMPROJ_PREFERENCE.index(precision) if precision in MMPROJ_PREFERENCE \
            else len(MMPROJ_PREFERENCE)

    ranked = sorted(mmprojs, key=rank)
    return models[0], (ranked[0] if ranked else None)


def _repo_files(repo_id: str, revision: str | None, cache_dir: str | None,
                download: bool) -> list[str]:
    """The repository's GGUF files: from the Hub (a dry run of the download), or from its
    cached snapshot where the Hub is not asked (offline, doctor) or cannot be reached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import DryRunError

    if download:
        try:
            return [f.filename for f in snapshot_download(
                repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=["*.gguf"],
                dry_run=True)]
        except DryRunError:    # offline or unreachable: what the cache holds may do
            pass
    snapshot = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                      local_files_only=True, allow_patterns=["*.gguf"]))
    return [str(p.relative_to(snapshot)) for p in snapshot.rglob("*.gguf")]


@contextlib.contextmanager
def _hub_errors(repo_id: str, tag: str | None, revision: str | None, download: bool):
    """huggingface_hub's failures as FileNotFoundError saying which case it is."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    at = f" at revision {revision!r}" if revision else ""
    try:
        yield
    except GatedRepoError as exc:
        raise FileNotFoundError(f"{repo_id!r} is a gated model on the Hugging Face Hub: accept "
                                "its terms on its page and set HF_TOKEN") from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise FileNotFoundError(f"{repo_id!r} is no local path, and the Hugging Face Hub has no "
                                f"model by that name{at} (a private one needs HF_TOKEN)") from exc
    except LocalEntryNotFoundError as exc:
        why = ("only the cache was read" if not download else
               "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else
               "the Hub could not be reached")
        only = f' --include "*{tag}*.gguf" "mmproj*"' if tag else ""   # not every quantization
        raise FileNotFoundError(f"{repo_id!r} is no local path, and not in the Hugging Face "
                                f"cache{at} ({why}); download it there first (hf download "
                                f"{repo_id}{only}) or give its directory") from exc
    except HfHubHTTPError as exc:
        raise FileNotFoundError(f"{repo_id!r}: the Hugging Face Hub answered {exc}") from exc
