"""Drafters named by a Hugging Face Hub id, `org/name` or `org/name@revision`, wherever a drafter folder is taken
(`draftsmith eval --drafter`, `hybrid:`, `draftsmith info`, `init_from`).

A name that is an existing folder is that folder. Otherwise a hub id is looked up in the local Hugging Face cache
first (what works offline, e.g. after `hf download org/name` on a machine with network, or a cache copied over),
and downloaded only when the cache lacks it and offline mode (HF_HUB_OFFLINE=1) is off. Only the files a drafter
folder is read from are fetched: JSON (config, tokenizer), safetensors weights, text files and tokenizer models;
pickle checkpoints never are, since `draftsmith.export.readers` refuses them anyway. Targets given by hub id load
through `transformers` (`draftsmith.target`), which uses the same cache.
"""

from __future__ import annotations

import re
from pathlib import Path

from draftsmith.errors import DraftsmithError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
"""`org/name` with an optional `@revision` (a branch, tag or commit)"""
FILES = ["*.json", "*.safetensors", "*.txt", "*.md", "*.model", "*.jinja"]
"""what a drafter folder is read from; nothing else is downloaded"""


def is_hub_id(spec: str) -> bool:
    """Whether `spec` names a hub repository rather than a local path (an existing path always wins)."""
    return bool(HUB_ID.match(spec)) and not Path(spec).expanduser().exists()


def drafter_folder(spec: str) -> Path:
    """The local folder `spec` names: the path itself, or a hub id's snapshot from the cache or, online, the Hub.

    A spec that is neither an existing path nor a hub id comes back as its path, for the caller to report as a
    missing folder in its own words."""
    if not is_hub_id(spec):
        return Path(spec).expanduser()
    import huggingface_hub
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo, _, revision = spec.partition("@")
    try:
        return Path(snapshot_download(repo, revision=revision or None, allow_patterns=FILES, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if huggingface_hub.is_offline_mode():
        raise DraftsmithError(
            f"'{spec}' is not a local folder, and as a hub id it is not in the Hugging Face cache "
            f"({huggingface_hub.constants.HF_HUB_CACHE}) while offline mode is on (HF_HUB_OFFLINE). Download it "
            f"where there is network (`hf download {repo}`) and copy the cache over, or pass a local folder.")
    try:
        return Path(snapshot_download(repo, revision=revision or None, allow_patterns=FILES))
    except Exception as err:  # no such repository, no network, no access: one paragraph, the cause named
        raise DraftsmithError(
            f"'{spec}' is not a local folder, and downloading it as a hub id failed ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else 'no message'}). Pass a local folder, or check the "
            "name, the network and HF_TOKEN for a gated repository.") from err
