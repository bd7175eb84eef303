"""vitzoo's own format: a bare state dict in vitzoo's names, and the directory save_pretrained
writes (config.json, model.safetensors, README.md) all at once, in the layout that `card.choose`
picks, with vitzoo's keys in every config.json so that it reads back exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors.torch import save_file

from vitzoo.config import ViTConfig
from vitzoo.errors import CheckpointError, ConfigError
from vitzoo.io import atomic_path, recover, staged_directory, write_text
from vitzoo.version import __version__
from vitzoo.weights import ConvertedWeights, WeightFormat, timm, transformers
from vitzoo.weights.card import choose, render
from vitzoo.weights.layout import (CARD_NAME, CONFIG_NAME, PREPROCESSOR_NAME, WEIGHTS_NAME,
                                   square_side)

FORMAT, FORMAT_VERSION = "vitzoo", 2  # 2: weight_names may be timm's or transformers'
WRITERS = {"timm": (timm.document, timm.to_timm), "transformers": (transformers.document,
                                                                   transformers.to_transformers)}


class VitzooFormat(WeightFormat):
    """A bare vitzoo state dict (a model.safetensors without its config.json, say)."""

    name = FORMAT

    def recognises(self, keys, metadata) -> bool:
        return "stem.proj.weight" in keys and any(k.startswith("encoder.") for k in keys)

    def convert(self, state_dict, metadata) -> ConvertedWeights:
        return ConvertedWeights(FORMAT, dict(state_dict), {}, grid_of(state_dict))


def grid_of(state_dict) -> tuple[int, int] | None:
    """The token grid of each kind's position tensors: a 1-D table's positions, a 2-D one's rows
    and columns, a relative table's 2N - 1 offsets (one more with a class token)."""
    prefix = int("cls_token" in state_dict)
    for name in ("encoder.pos_embed.weight", "encoder.pos_embed.0.weight"):
        if (pos := state_dict.get(name)) is not None and pos.ndim == 3:
            side = square_side(pos.shape[1] - prefix)
            return (side, side) if side else None
    for name in ("encoder.pos_embed.row", "encoder.pos_embed.0.row"):
        if (row := state_dict.get(name)) is not None:
            col = state_dict.get(name.replace("row", "col"))
            return (int(row.shape[0]), int(col.shape[0])) if col is not None else None
    if (table := state_dict.get("encoder.blocks.0.attn.relative.table")) is not None:
        offsets = table.shape[0] - prefix
        side = square_side((offsets + 1) // 2) if offsets % 2 else None
        return (side, side) if side else None
    return None


# ---------------------------------------------------------------- writing
def save_state_dict(state_dict: dict, path, metadata: dict | None = None) -> None:
    """A safetensors file written atomically, each tensor an unshared contiguous host copy."""
    tensors = {k: v.detach().to("cpu").contiguous().clone() if v.device.type == "cpu"
               else v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def save_pretrained(model, directory, extra: dict | None = None, card: dict | None = None,
                    layout: str = FORMAT) -> Path:
    """config.json, model.safetensors and the card README.md, in `layout` (see `choose`), put in
    place together: a failed save leaves `directory` as it was."""
    if Path(directory).parent.is_dir():
        recover(Path(directory))  # what a killed save left
    layout = choose(model.config, layout)
    return write_model(directory, model.config, model.state_dict(), getattr(model, "labels", None),
                       layout, render(model, card, layout), extra)


def write_model(directory, config: ViTConfig, state_dict: dict, labels: list[str] | None,
                layout: str, card_text: str | None, extra: dict | None = None) -> Path:
    """A model's files in `layout` written into `directory` at once (the config last)."""
    document, rename = WRITERS.get(layout, (lambda config, labels: {}, dict))
    labels = list(labels) if labels is not None and len(labels) == config.num_classes else None
    vitzoo = {"format": FORMAT, "format_version": 1 if layout == FORMAT else FORMAT_VERSION,
              "vitzoo_version": __version__, "model": config.to_dict(),
              **({"labels": labels} if labels else {}),
              **({"weight_names": layout} if layout != FORMAT else {})}
    texts = {CARD_NAME: card_text} if card_text is not None else {}
    if layout == "transformers":
        texts[PREPROCESSOR_NAME] = json.dumps(transformers.preprocessor(config), indent=2) + "\n"
    texts[CONFIG_NAME] = json.dumps({**document(config, labels), **vitzoo, **(extra or {})},
                                    indent=2, sort_keys=True) + "\n"
    # an earlier save's preprocessor_config.json goes: transformers would read it
    replaces = () if PREPROCESSOR_NAME in texts else (PREPROCESSOR_NAME,)
    with staged_directory(Path(directory), (WEIGHTS_NAME, *texts), replaces) as stage:
        save_state_dict(rename(state_dict), stage / WEIGHTS_NAME, metadata={"format": "pt"})
        for name, text in texts.items():
            write_text(stage / name, text)
    return Path(directory)


# ---------------------------------------------------------------- reading
def is_saved(document: dict | None) -> bool:
    return document is not None and document.get("format") == FORMAT


def read_config(document: dict, path) -> tuple[ViTConfig, str, list[str] | None]:
    """A save_pretrained config.json's model config, whose names its weights are in, its labels."""
    version, names = document.get("format_version"), document.get("weight_names")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"{path}: format_version {version!r} is not an int this vitzoo "
                              f"reads (up to {FORMAT_VERSION}); upgrade vitzoo if it is newer")
    if names not in (None, *WRITERS, FORMAT):
        raise CheckpointError(f"{path}: weight_names must be one of timm, transformers, vitzoo")
    try:
        config = ViTConfig.from_dict(document["model"])
    except (ConfigError, TypeError, KeyError, AttributeError) as exc:  # no object, no option
        raise ConfigError(f"{path}: the saved model config is not valid: {exc}") from exc
    return config, names or FORMAT, document.get("labels")


def check_describes(config: ViTConfig, state_dict: dict, path) -> None:
    """Refuse a saved config that does not describe its weights (depth, width, MLP size), before a
    model of perhaps absurd size is built."""
    blocks = {m[1] for k in state_dict if (m := re.match(r"encoder\.blocks\.(\d+)\.", k))}
    held = {"depth": len(blocks)}
    for option, key, axis in (("embed_dim", "encoder.blocks.0.norm1.weight", 0),
                              ("mlp_dim", "encoder.blocks.0.mlp.fc1.weight", 0)):
        if (tensor := state_dict.get(key)) is not None and tensor.ndim > axis:
            held[option] = int(tensor.shape[axis])
    differ = [f"{k}={getattr(config, k)} where the weights have {v}" for k, v in held.items()
              if getattr(config, k) != v]
    if differ:
        raise CheckpointError(f"{path} does not describe its weights: it says {'; '.join(differ)}; "
                              "fix it, or save the model again")
