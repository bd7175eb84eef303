"""Pushing a model, or a directory save_pretrained wrote, to the Hub as one commit, in the layout
of the library that loads it, once the folder loads as the model its config describes."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from vitzoo.errors import CheckpointError, ConfigError, HubError
from vitzoo.weights import check_state_dict, hub
from vitzoo.weights.card import choose, with_usage
from vitzoo.weights.files import Source, open_directory, read_json
from vitzoo.weights.layout import CARD_NAME, CONFIG_NAME, PREPROCESSOR_NAME, WEIGHTS_NAME
from vitzoo.weights.native import WRITERS, is_saved, save_pretrained, write_model

PUSHED = (WEIGHTS_NAME, CARD_NAME, CONFIG_NAME, PREPROCESSOR_NAME)


def check_loads(directory: Path, model_class: type, repo_id: str) -> Source:
    """What `directory` holds, once it reads as a saved model whose every tensor fits the model
    its config describes (built on the meta device); nothing is pushed otherwise."""
    try:
        if not is_saved(read_json(directory / CONFIG_NAME)):
            raise CheckpointError(f"{directory / CONFIG_NAME} is not one save_pretrained wrote")
        source = open_directory(directory, {})  # a saved model's: no other format
        with torch.device("meta"):
            model = model_class(source.saved_config)
        check_state_dict(model, source.checkpoint.state_dict, str(directory))
    except (CheckpointError, ConfigError) as exc:
        raise type(exc)(f"nothing was pushed to {repo_id}: {exc}") from exc
    return source


def _layout(config, requested: str, repo_id: str) -> str:
    try:
        return choose(config, requested)
    except ConfigError as exc:
        raise ConfigError(f"nothing was pushed to {repo_id}: {exc}") from exc


def push_folder(directory, repo_id: str, *, model_class: type, format: str = "auto",
                **options: Any) -> str:
    """Upload a save_pretrained directory (left as it is) in the layout `format` chooses, its
    card's usage made this repo's; `options` are `hub.upload_folder`'s. Returns the commit URL."""
    directory = Path(directory)
    if not (directory / WEIGHTS_NAME).exists():
        raise HubError(f"{directory} has no {WEIGHTS_NAME}: write it with model.save_pretrained()")
    source = check_loads(directory, model_class, repo_id)
    config = source.saved_config
    layout = _layout(config, format, repo_id)
    document = read_json(directory / CONFIG_NAME)  # its keys a save writes anew, and its own
    library, _ = WRITERS.get(document.get("weight_names"), (lambda config, labels: {}, None))
    written = {"format", "format_version", "vitzoo_version", "model", "labels", "weight_names",
               *library(config, source.labels)}
    own = {k: v for k, v in document.items() if k not in written}  # a training run's data, say
    card = directory / CARD_NAME
    text = (with_usage(card.read_text(encoding="utf-8"), config, repo_id, layout)
            if card.is_file() else None)
    with tempfile.TemporaryDirectory(prefix="vitzoo-push-") as tmp:
        write_model(Path(tmp) / "repo", config, source.checkpoint.state_dict, source.labels,
                    layout, text, own)
        return _upload(Path(tmp) / "repo", repo_id, **options)


def push_to_hub(model, repo_id: str, *, card: dict[str, Any] | None = None, format: str = "auto",
                **options: Any) -> str:
    """`model.save_pretrained` into the folder uploaded, the card made for `repo_id`; `options`:
    token, private, revision, commit_message, endpoint. Returns the commit URL."""
    layout = _layout(model.config, format, repo_id)
    with tempfile.TemporaryDirectory(prefix="vitzoo-push-") as tmp:
        folder = Path(tmp) / "repo"
        save_pretrained(model, folder, card={"repo_id": repo_id, **(card or {})}, layout=layout)
        check_loads(folder, type(model), repo_id)
        return _upload(folder, repo_id, **options)


def _upload(folder: Path, repo_id: str, **options: Any) -> str:
    # an earlier transformers push's preprocessor_config.json goes when this layout has none
    return hub.upload_folder(folder, repo_id, PUSHED, replaces=(PREPROCESSOR_NAME,), **options)
