"""Pushing a model, or a directory save_pretrained wrote, to the Hub as one commit, in the layout
of the library that loads it, once the folder loads as the model its config describes."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from vitzoo.errors import CheckpointError, ConfigError
from vitzoo.weights import hub
from vitzoo.weights.card import choose, with_usage
from vitzoo.weights.files import Source, open_directory
from vitzoo.weights.layout import CARD_NAME, CONFIG_NAME, PREPROCESSOR_NAME, WEIGHTS_NAME
from vitzoo.weights.native import save_pretrained, write_model

PUSHED = (WEIGHTS_NAME, CARD_NAME, CONFIG_NAME, PREPROCESSOR_NAME)


@contextmanager
def refused(repo_id: str):
    try:
        yield
    except (CheckpointError, ConfigError) as exc:
        raise type(exc)(f"nothing was pushed to {repo_id}: {exc}") from exc


def check_loads(directory: Path, model_class: type) -> Source:
    """What `directory` holds, once it reads as a saved model whose every tensor fits the model
    its config describes (built on the meta device); nothing is pushed otherwise."""
    source = open_directory(directory, {})  # a saved model's: no other format
    if source.saved_config is None:
        raise CheckpointError(f"{directory / CONFIG_NAME} is not one save_pretrained wrote")
    with torch.device("meta"):
        model = model_class(source.saved_config)
    try:  # torch lists every missing, unexpected and mis-shaped tensor
        model.load_state_dict(source.checkpoint.state_dict, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{directory}: {exc}") from None
    return source


def push_folder(directory, repo_id: str, *, model_class: type, format: str = "auto",
                **options: Any) -> str:
    """Upload a save_pretrained directory (left as it is) in the layout `format` chooses, its
    card's usage made this repo's; `options` are `hub.upload_folder`'s. Returns the commit URL."""
    directory = Path(directory)
    with refused(repo_id):
        source = check_loads(directory, model_class)
        layout = choose(source.saved_config, format)
    config = source.saved_config
    card = directory / CARD_NAME
    text = (with_usage(card.read_text(encoding="utf-8"), config, repo_id, layout)
            if card.is_file() else None)
    with tempfile.TemporaryDirectory(prefix="vitzoo-push-") as tmp:
        write_model(Path(tmp) / "repo", config, source.checkpoint.state_dict, source.labels,
                    layout, text)
        return _upload(Path(tmp) / "repo", repo_id, **options)


def push_to_hub(model, repo_id: str, *, card: dict[str, Any] | None = None, format: str = "auto",
                **options: Any) -> str:
    """`model.save_pretrained` into the folder uploaded, the card made for `repo_id`; `options`:
    token, private, revision, commit_message, endpoint. Returns the commit URL."""
    with refused(repo_id):
        layout = choose(model.config, format)
    with tempfile.TemporaryDirectory(prefix="vitzoo-push-") as tmp:
        folder = Path(tmp) / "repo"
        save_pretrained(model, folder, card={"repo_id": repo_id, **(card or {})}, layout=layout)
        with refused(repo_id):
            check_loads(folder, type(model))
        return _upload(folder, repo_id, **options)


def _upload(folder: Path, repo_id: str, **options: Any) -> str:
    # an earlier transformers push's preprocessor_config.json goes when this layout has none
    return hub.upload_folder(folder, repo_id, PUSHED, replaces=(PREPROCESSOR_NAME,), **options)
