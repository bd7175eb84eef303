"""Publishing a directory that save_pretrained wrote on the Hugging Face Hub: checked, written in
the layout of the library that loads it (`vitzoo.checkpoints.layouts`), then uploaded through
`vitzoo.weights.hub` as one commit; a model is saved once, into the folder uploaded.

    model.push_to_hub("alice/vit-b16-cifar10")   # config.json, model.safetensors, README.md
    vitzoo push DIRECTORY alice/vit-b16-cifar10  # a directory save_pretrained (or training) wrote

`format`: "auto" (the default) writes timm's layout where timm builds the model, else
transformers', else vitzoo's own; "timm" or "transformers" asks for that library's and refuses a
model it cannot build, saying why; "vitzoo" keeps vitzoo's. vitzoo loads every layout exactly.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vitzoo.checkpoints.card import with_usage
from vitzoo.checkpoints.layouts import choose, without_library_keys
from vitzoo.checkpoints.native import read_config, read_json_object, save_pretrained, write_model
from vitzoo.errors import CheckpointError, ConfigError, HubError
from vitzoo.weights import hub
from vitzoo.weights.converted import check_state_dict
from vitzoo.weights.layout import (CARD_NAME, CONFIG_NAME, PREPROCESSOR_NAME, SAVED_FILES,
                                   WEIGHTS_NAME)

if TYPE_CHECKING:
    from vitzoo.checkpoints.sources import Source

PUSHED_FILES = (*SAVED_FILES, PREPROCESSOR_NAME)  # transformers' layout adds its image processor
# the config.json keys write_model writes anew; any other (a training run's data) is kept
VITZOO_KEYS = ("format", "format_version", "vitzoo_version", "model", "labels", "weight_names")


def check_loads(directory: str | os.PathLike, model_class: type, repo_id: str) -> Source:
    """Refuse a folder that does not load as the model its config describes, before anything is
    uploaded: the config reads, the weights read whole, and every tensor has the name, shape and
    kind that model has (built on the meta device: nothing is allocated). `model_class` is the
    model's class (`VisionTransformer`, passed in: the model imports this module). Returns what
    it read."""
    from vitzoo.checkpoints.sources import open_directory

    directory = Path(directory)
    try:
        read_config(directory / CONFIG_NAME)  # only a saved vitzoo model is pushed
        source = open_directory(directory)
        with torch.device("meta"):
            model = model_class(source.saved_config)
        check_state_dict(model, source.checkpoint.state_dict, str(directory))
    except (CheckpointError, ConfigError) as exc:
        raise type(exc)(f"{directory} does not load as a model, so nothing was pushed to "
                        f"{repo_id}: {exc}") from exc
    return source


def relaid(directory: Path, source: Source, repo_id: str, requested: str, stage: Path) -> str:
    """The saved model in `directory` (read as `source`) written into `stage` in the layout
    `requested` chooses, its card's usage section made this repo's; returns the layout. The card's
    other sections and config.json's own keys (a training run's data, say) are kept."""
    config = source.saved_config
    try:
        layout = choose(config, requested)
    except ConfigError as exc:
        raise ConfigError(f"nothing was pushed to {repo_id}: {exc}") from exc
    document = read_json_object(directory / CONFIG_NAME)
    own = {k: v for k, v in without_library_keys(document).items() if k not in VITZOO_KEYS}
    card = directory / CARD_NAME
    card_text = with_usage(card.read_text(encoding="utf-8"), config, repo_id,
                           layout) if card.is_file() else None
    write_model(stage, config, source.checkpoint.state_dict, source.labels, layout, card_text, own)
    return layout


def _upload(stage: Path, repo_id: str, **options: Any) -> str:
    # an earlier transformers push's preprocessor_config.json goes when this layout has none
    return hub.upload_folder(stage, repo_id, PUSHED_FILES, replaces=(PREPROCESSOR_NAME,), **options)


def push_folder(
    directory: str | os.PathLike,
    repo_id: str,
    *,
    model_class: type,
    format: str = "auto",
    **options: Any,
) -> str:
    """Upload a directory written by `save_pretrained` as one commit, once it loads as a model of
    `model_class` (`check_loads`), in the layout `format` chooses (see the module's docstring; the
    directory itself is not changed). `options`: those of `hub.upload_folder` (token, private,
    revision, commit_message, endpoint). Returns the commit's URL."""
    directory = Path(directory)
    if not (directory / WEIGHTS_NAME).exists():
        raise HubError(f"{directory} has no {WEIGHTS_NAME}; write it with model.save_pretrained()")
    source = check_loads(directory, model_class, repo_id)
    with tempfile.TemporaryDirectory(prefix="vitzoo-push-") as tmp:
        stage = Path(tmp) / "repo"
        relaid(directory, source, repo_id, format, stage)
        return _upload(stage, repo_id, **options)


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
    format: str = "auto",
) -> str:
    """`model.save_pretrained` once, with the card made for `repo_id`, into the folder uploaded, in
    the layout `format` chooses (see the module's docstring: timm's where timm builds the model);
    uploaded once it loads as a model of the model's class (one changed by hand after it was built
    may not). Returns the commit's URL."""
    try:
        layout = choose(model.config, format)
    except ConfigError as exc:
        raise ConfigError(f"nothing was pushed to {repo_id}: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="vitzoo-push-") as tmp:
        stage = Path(tmp) / "repo"
        save_pretrained(model, stage, card={"repo_id": repo_id, **(card or {})}, layout=layout)
        check_loads(stage, type(model), repo_id)
        return _upload(stage, repo_id, token=token, private=private, revision=revision,
                       commit_message=commit_message, endpoint=endpoint)
