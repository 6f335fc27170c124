"""A model named by its Hugging Face Hub id (`--model zai-org/AutoGLM-Phone-9B`, as in
Open-AutoGLM's vLLM command line): found in the local Hugging Face cache or fetched into it
(with huggingface_hub's own progress bars), then served from that directory like any local
checkpoint. HF_HUB_OFFLINE=1 keeps to the cache; HF_TOKEN, HF_HOME and HF_HUB_CACHE apply as
for every Hugging Face tool."""
from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)

# config, generation config, tokenizer, chat template, image processor: what a checkpoint
# directory is read for, without its weights
CHECKPOINT_FILES = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
WEIGHT_FILES = ["*.safetensors"]


def looks_like_repo_id(name: str) -> bool:
    """`owner/name`, as the Hub spells ids (a bare name is more likely a mistyped local
    path)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.count("/") != 1 or name.startswith((".", "~")):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def fetch_from_hub(repo_id: str, revision: str | None = None, cache_dir: str | None = None,
                   weights: bool = True, download: bool = True) -> Path:
    """The local snapshot directory of repo_id (its safetensors too unless not weights: a
    model run with dummy weights needs only its config and tokenizer; without download, the
    cache only, as `doctor` looks). Raises FileNotFoundError saying why when there is none."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    at = f" at revision {revision!r}" if revision else ""
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                 allow_patterns=CHECKPOINT_FILES + (WEIGHT_FILES if weights else []),
                                 local_files_only=not download)
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
        raise FileNotFoundError(f"{repo_id!r} is no local path, and not in the Hugging Face "
                                f"cache{at} ({why}); download it there first (hf download "
                                f"{repo_id}) or give its directory") from exc
    except HfHubHTTPError as exc:
        raise FileNotFoundError(f"{repo_id!r}: the Hugging Face Hub answered {exc}") from exc
    logger.info("%s%s: %s", repo_id, at, path)
    return Path(path)
