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

import torch

from vitzoo.checkpoints.native import read_config, save_pretrained
from vitzoo.errors import CheckpointError, ConfigError, HubError
from vitzoo.hub import transport
from vitzoo.weights.converted import check_state_dict
from vitzoo.weights.layout import CONFIG_NAME, SAVED_FILES, WEIGHTS_NAME


def check_loads(directory: str | os.PathLike, model_class: type, repo_id: str) -> None:
    """Refuse a folder that does not load as the model its config describes, before anything is
    uploaded: the config reads, the weights read whole, and every tensor has the name, shape and kind
    that model has (built on the meta device: nothing is allocated). `model_class` is the model's
    class (`VisionTransformer`, passed in: the model imports this module)."""
    from vitzoo.checkpoints.sources import open_directory

    directory = Path(directory)
    try:
        read_config(directory / CONFIG_NAME)  # only a saved vitzoo model is pushed
        source = open_directory(directory)
        with torch.device("meta"):
            model = model_class(source.saved_config)
        check_state_dict(model, source.checkpoint.state_dict, str(directory))
    except (CheckpointError, ConfigError) as exc:
        raise type(exc)(f"{directory} does not load as a model, so nothing was pushed to {repo_id}: {exc}") from exc


def push_folder(
    directory: str | os.PathLike,
    repo_id: str,
    *,
    model_class: type,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload vitzoo model",
    endpoint: str | None = None,
) -> str:
    """Upload a directory written by `save_pretrained` as one commit, once it loads as a model of
    `model_class` (`check_loads`); create the repo (and the branch `revision`) when they do not exist.
    Returns the commit's URL."""
    directory = Path(directory)
    if not (directory / WEIGHTS_NAME).exists():
        raise HubError(f"{directory} has no {WEIGHTS_NAME}; write it with model.save_pretrained(...)")
    check_loads(directory, model_class, repo_id)
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
    """`model.save_pretrained` into a temporary directory, then `push_folder` it (checked to load as a
    model of the model's class: one changed by hand after it was built may not)."""
    with tempfile.TemporaryDirectory(prefix="vitzoo-push-") as tmp:
        save_pretrained(model, tmp, card={"repo_id": repo_id, **(card or {})})
        return push_folder(tmp, repo_id, model_class=type(model), token=token, private=private, revision=revision,
                           commit_message=commit_message, endpoint=endpoint)
