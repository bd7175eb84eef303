"""vitzoo's own format on disk: a directory with config.json, model.safetensors and a README.md
model card, written atomically, and read back (a bare state dict in vitzoo's names is the converter
`vitzoo.weights.vitzoo_format`)."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file

from vitzoo.checkpoints import layouts
from vitzoo.checkpoints.card import render
from vitzoo.checkpoints.layouts import NATIVE
from vitzoo.config import ViTConfig
from vitzoo.errors import CheckpointError, ConfigError
from vitzoo.io import atomic_path, recover, staged_directory, write_text
from vitzoo.version import __version__
from vitzoo.weights.converted import read_failed
from vitzoo.weights.layout import CARD_NAME, CONFIG_NAME, PREPROCESSOR_NAME, WEIGHTS_NAME
from vitzoo.weights.vitzoo_format import FORMAT

FORMAT_VERSION = 2  # 2 adds weight_names (weights in timm's or transformers' names)


def _unshared_host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `tensor` on the host that shares storage with nothing."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        return tensor.to("cpu").contiguous()
    return tensor.contiguous().clone()


def save_state_dict(state_dict: dict[str, torch.Tensor], path: str | os.PathLike,
                    metadata: dict[str, str] | None = None) -> None:
    """safetensors file written atomically (tensors made contiguous and unshared)."""
    # a copy of each: safetensors refuses tensors that share storage (e.g. tied or sliced
    # parameters); one on a GPU is copied straight to the host (a clone on the GPU first would need
    # the model's size twice)
    tensors = {k: _unshared_host_copy(v) for k, v in state_dict.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def config_document(config: ViTConfig, extra: dict | None = None, labels: list[str] | None = None,
                    layout: str = NATIVE) -> dict:
    """config.json: the format, the model's config, and the head's class names when the model has
    them; for a model written in timm's or transformers' layout (`vitzoo.checkpoints.layouts`), that
    library's keys too, and `weight_names` saying whose names the weights are in (format_version 2:
    a vitzoo that reads only vitzoo's names says to upgrade instead of failing on the names)."""
    fits = labels is not None and len(labels) == config.num_classes
    named = {"labels": list(labels)} if fits else {}
    foreign = {"weight_names": layout} if layout != NATIVE else {}
    return {**layouts.library_document(config, labels, layout), "format": FORMAT,
            "format_version": FORMAT_VERSION if foreign else 1, "vitzoo_version": __version__,
            "model": config.to_dict(), **named, **foreign, **(extra or {})}


def weight_names_of(document: dict, path: str | os.PathLike) -> str:
    """Whose names the weights beside a saved config.json are in: vitzoo's unless `weight_names`
    says timm's or transformers'."""
    names = document.get("weight_names", NATIVE)
    if names not in layouts.LAYOUTS:
        raise CheckpointError(f"{path}: weight_names must be one of {', '.join(layouts.LAYOUTS)}, "
                              f"got {names!r:.100}")
    return names


def labels_of(document: dict) -> list[str] | None:
    """The class names a save_pretrained config.json gives (None when it gives none); a
    CheckpointError for a list that is not of names."""
    labels = document.get("labels")
    if labels is None:
        return None
    if not isinstance(labels, list) or not all(isinstance(name, str) for name in labels):
        raise CheckpointError("config.json's 'labels' must be a list of class names, got "
                              f"{labels!r:.200}")
    return labels


def save_pretrained(model, directory: str | os.PathLike, extra: dict | None = None,
                    card: dict | None = None, layout: str = NATIVE) -> Path:
    """Write `model.safetensors`, the model card `README.md` and `config.json` into `directory`
    (created if needed). `card` fills the model card (see `vitzoo.checkpoints.card`); `layout` is
    the library whose names and config keys the files use (vitzoo's own, timm's or transformers':
    see `vitzoo.checkpoints.layouts.choose`, which refuses a model that library cannot build).

    The card and config are rendered (and so checked) before anything is written; the files
    are written beside `directory` and put in place together (`vitzoo.io.staged_directory`), so a
    failed save leaves `directory` as it was: an earlier save there stays whole and loadable.
    """
    if Path(directory).parent.is_dir():
        recover(Path(directory))  # what a killed save left: put right even if this one is refused
    layout = layouts.choose(model.config, layout)
    return write_model(directory, model.config, model.state_dict(), getattr(model, "labels", None),
                       layout, render(model, card, layout), extra)


def write_model(directory: str | os.PathLike, config: ViTConfig,
                state_dict: dict[str, torch.Tensor], labels: list[str] | None, layout: str,
                card_text: str | None, extra: dict | None = None) -> Path:
    """The files of a model in `layout` (already chosen) written into `directory` all at once: the
    weights renamed, config.json, the card `card_text` (none when None), and transformers'
    preprocessor_config.json (an earlier save's is removed when the layout is another). What an
    earlier save killed part-way left there is the caller's to recover (`save_pretrained` does)."""
    directory = Path(directory)
    texts = {CARD_NAME: card_text} if card_text is not None else {}
    if layout == "transformers":
        texts[PREPROCESSOR_NAME] = json.dumps(layouts.transformers_preprocessor(config),
                                              indent=2) + "\n"
    texts[CONFIG_NAME] = json.dumps(config_document(config, extra, labels, layout), indent=2,
                                    sort_keys=True) + "\n"
    tensors = layouts.renamed(state_dict, layout)
    # the config marks a complete save, so it is the last file renamed into a directory that holds
    # more; an earlier save's image processor config goes when this layout has none (transformers
    # would read it)
    replaces = () if PREPROCESSOR_NAME in texts else (PREPROCESSOR_NAME,)
    with staged_directory(directory, (WEIGHTS_NAME, *texts), replaces) as stage:
        save_state_dict(tensors, stage / WEIGHTS_NAME, metadata={"format": "pt"})
        for name, text in texts.items():
            write_text(stage / name, text)
    return directory


def read_json_object(path: str | os.PathLike) -> dict:
    """A JSON object file (config.json and the like); a CheckpointError says what is wrong."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise read_failed(path, exc) from exc
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); it "
                              "should be JSON") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise CheckpointError(f"{path} is not a JSON object (it holds a {type(document).__name__})")
    return document


def read_config(path: str | os.PathLike) -> ViTConfig:
    document = read_json_object(path)
    if document.get("format") != FORMAT or not isinstance(document.get("model"), dict):
        raise CheckpointError(f"{path} is not a vitzoo config.json (no 'format': 'vitzoo' and "
                              "'model' object)")
    version = document.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise CheckpointError(f"{path}: format_version must be an int, got {version!r}")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format_version {document['format_version']}, newer than this vitzoo reads "
            f"({FORMAT_VERSION}); upgrade vitzoo"
        )
    try:
        config = ViTConfig.from_dict(document["model"])
    except (ConfigError, TypeError) as exc:  # TypeError: a value of a type no option takes
        raise ConfigError(f"{path}: the saved model config is not valid: {exc}") from exc
    check_size(config, f"{path} describes",
               f"the file is damaged or was edited; save the model again, or fix {Path(path).name}")
    missing = [name for name in ViTConfig.field_names() if name not in document["model"]]
    if missing:  # save_pretrained writes every option: these were left out by hand
        warnings.warn(f"{path} does not give the model options {', '.join(missing)}; their "
                      "defaults are used: "
                      + ", ".join(f"{name}={getattr(config, name)!r}" for name in missing),
                      stacklevel=2)
    return config


def is_saved(document: dict | None) -> bool:
    """Whether a config.json document is one save_pretrained wrote."""
    return document is not None and document.get("format") == FORMAT


def parameter_floor(config: ViTConfig) -> int:
    """A lower bound on the parameters of the model `config` describes, counted from its options
    without building anything: the encoder blocks' attention and MLP matrices, a learned position
    embedding, the head. Python's integers: no size overflows."""
    p, (h, w) = config.patch_size, config.img_size
    d, tokens = config.embed_dim, (h // p) * (w // p)
    blocks = config.depth * (4 * d * d + 2 * d * config.mlp_dim)
    position = tokens * d if config.pos_embed.startswith("learned") else 0
    return blocks + position + d * config.num_classes


def memory_bytes() -> int | None:
    """This machine's physical memory, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_size(config: ViTConfig, what: str, fix: str) -> None:
    """Refuse a config whose model cannot fit this machine's memory in float32, before anything is
    built (a depth of a million had grown memory for minutes; a width of 1e9 failed in torch's
    allocator): `what` describes the model ("PATH describes"), `fix` says what to do."""
    floor, memory = parameter_floor(config), memory_bytes()
    if memory is not None and 4 * floor > memory:
        raise CheckpointError(
            f"{what} a model of at least {floor:.3g} parameters ({4 * floor / 2**30:.3g} GiB in "
            f"float32; embed_dim={config.embed_dim}, depth={config.depth}, "
            f"mlp_dim={config.mlp_dim}, img_size={config.img_size}), more than this machine's "
            f"{memory / 2**30:.3g} GiB of memory: {fix}")


_BLOCK = re.compile(r"^encoder\.blocks\.(\d+)\.")


def check_describes(config: ViTConfig, state_dict: dict, config_path: str | os.PathLike,
                    weights_path: str | os.PathLike) -> None:
    """Refuse a saved config that does not describe the weights beside it, compared by the tensors'
    names and shapes before a model is built: the number of encoder blocks, their width and MLP size
    (any other difference is the strict loader's to list, on a model of a sane size)."""
    blocks = 1 + max((int(m.group(1)) for k in state_dict if (m := _BLOCK.match(k))), default=-1)
    held = {"depth": blocks}
    if (norm := state_dict.get("encoder.blocks.0.norm1.weight")) is not None and norm.ndim == 1:
        held["embed_dim"] = int(norm.shape[0])
    if (fc1 := state_dict.get("encoder.blocks.0.mlp.fc1.weight")) is not None and fc1.ndim == 2:
        held["mlp_dim"] = int(fc1.shape[0])
    differ = [f"{k}={getattr(config, k)} where the weights have {v}" for k, v in held.items()
              if getattr(config, k) != v]
    if differ:
        raise CheckpointError(
            f"{config_path} does not describe the weights in {weights_path}: it says "
            f"{'; '.join(differ)}. The config was edited or belongs to other weights: fix "
            f"{Path(config_path).name}, or save the model again")
