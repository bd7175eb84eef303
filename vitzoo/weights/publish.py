"""Publishing vitzoo's own format on the Hugging Face Hub: a directory that save_pretrained wrote,
checked, then uploaded through `vitzoo.hub.transport` as one commit; a model is saved first.

    model.push_to_hub("alice/vit-b16-cifar10")   # config.json, model.safetensors, README.md
    vitzoo push DIRECTORY alice/vit-b16-cifar10  # a directory save_pretrained (or training) wrote
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from vitzoo.errors import HubError
from vitzoo.hub import transport
from vitzoo.weights.layout import CONFIG_NAME, SAVED_FILES, WEIGHTS_NAME
from vitzoo.weights.native import read_config, save_pretrained


def push_folder(
    directory: str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload vitzoo model",
    endpoint: str | None = None,
) -> str:
    """Upload a directory written by `save_pretrained` as one commit; create the repo (and the branch
    `revision`) when they do not exist. Returns the commit's URL."""
    directory = Path(directory)
    read_config(directory / CONFIG_NAME)  # refuse to upload something that is not a saved vitzoo model
    if not (directory / WEIGHTS_NAME).exists():
        raise HubError(f"{directory} has no {WEIGHTS_NAME}; write it with model.save_pretrained(...)")
    return transport.upload_folder(directory, repo_id, SAVED_FILES, commit_message=commit_message, token=token,
                                   private=private, revision=revision, endpoint=endpoint)


def push_to_hub(
    model,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload vitzoo model",
    endpoint: str | None = None,
    card: dict[str, Any] | None = None,
) -> str:
    """`model.save_pretrained` into a temporary directory, then `push_folder` it."""
    with tempfile.TemporaryDirectory(prefix="vitzoo-push-") as tmp:
        save_pretrained(model, tmp, card={"repo_id": repo_id, **(card or {})})
        return push_folder(tmp, repo_id, token=token, private=private, revision=revision,
                           commit_message=commit_message, endpoint=endpoint)
