"""Converted weights: a checkpoint in vitzoo's terms, whatever file it came from, and what decides
the model it builds.

A weight format (`vitzoo.weights.formats`) turns foreign weights into `ConvertedWeights`: a state
dict with vitzoo's names and the model options that the weights decide (their GELU, LayerNorm eps,
pooling, head). `vitzoo.pretrained` builds the model from them. (A training checkpoint, the state a
run resumes from, is `vitzoo.train.checkpoint`.)
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from vitzoo.config import ViTConfig
from vitzoo.errors import CheckpointError, ConfigError

# Options a checkpoint may decide; the user may still override the numerics (act, norm_eps).
USER_OVERRIDABLE = ("act", "norm_eps")
HEAD_KEYS = ("head.",)




def read_failed(path: str | os.PathLike, exc: BaseException) -> CheckpointError:
    """The error for a file that did not read: an OS error (no permission, a directory, gone) is
    said as such, as the file may be fine; anything else the reader raised means damaged bytes."""
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        return CheckpointError(f"cannot read {os.fspath(path)}: {reason}; check that it is a file "
                               "and that you may read it")
    pickled = _pickled(path) if os.fspath(path).endswith(".safetensors") else None
    if pickled:  # torch.save's file under a safetensors name: not damaged, misnamed
        return CheckpointError(f"{os.fspath(path)} is not a safetensors file: its bytes are "
                               f"{pickled}, as torch.save writes; rename it to .pth and it is read "
                               "as one (tensors only: nothing in it runs)")
    return CheckpointError(f"{os.fspath(path)} is damaged or truncated ({exc}); save or download "
                           "it again")


def _pickled(path: str | os.PathLike) -> str | None:
    """What a file's first bytes say torch.save wrote: a zip of pickles or a bare pickle."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    if head == b"PK\x03\x04":
        return "a zip archive of pickles"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:  # a pickle's PROTO and version
        return "a pickle"
    return None


@dataclass
class ConvertedWeights:
    """Weights in vitzoo's names, the format they were converted from, and what they decide."""

    format: str
    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any] = field(default_factory=dict)  # options the weights decide
    grid: tuple[int, int] | None = None  # token grid the position embeddings were trained at


@contextmanager
def converting(fmt: str, source: str):
    """Turn a tensor that a converter expects but the file lacks into a `CheckpointError` that says
    so, at the boundary, instead of a bare KeyError from inside the converter."""
    try:
        yield
    except KeyError as exc:
        raise CheckpointError(
            f"{source} has the names of a {fmt} checkpoint but lacks the tensor {exc.args[0]!r} "
            "that its other tensors imply: the file is incomplete, or was edited; save or "
            "download it again"
        ) from None


def take_head(params: dict[str, torch.Tensor], out: dict[str, torch.Tensor], config: dict[str, Any],
              pre_logits: str, classifier: str) -> None:
    """Move a PyTorch-layout head (an optional pre-logits Dense + tanh, then the classifier) from
    the foreign names `pre_logits` / `classifier` (prefixes of .weight/.bias) to vitzoo's, and
    record the options it decides: head, its representation_size, num_classes (0: no classifier)."""
    if f"{pre_logits}.weight" in params:
        weight = params.pop(f"{pre_logits}.weight")
        out["head.pre_logits.weight"] = weight
        out["head.pre_logits.bias"] = params.pop(f"{pre_logits}.bias")
        config.update(head="mlp", head_options={"representation_size": int(weight.shape[0])})
    else:
        config.update(head="linear", head_options={})
    if f"{classifier}.weight" in params:
        weight = params.pop(f"{classifier}.weight")
        out["head.fc.weight"] = weight
        out["head.fc.bias"] = params.pop(f"{classifier}.bias")
        config["num_classes"] = int(weight.shape[0])
    else:
        config["num_classes"] = 0


def kind_fits(tensor: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether `tensor` may be loaded into `expected`: a float, of any precision, where the model
    has a float (int64, int8 or bool weights are not numbers the model was trained with)."""
    return tensor.is_floating_point() or not expected.is_floating_point()


def check_state_dict(model: torch.nn.Module, state_dict: dict[str, torch.Tensor],
                     source: str) -> None:
    """Raise `CheckpointError` listing every difference between the weights and the model."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [
        f"{key}: checkpoint {tuple(state_dict[key].shape)} vs model {tuple(expected[key].shape)}"
        for key in sorted(set(expected) & set(state_dict))
        if state_dict[key].shape != expected[key].shape
    ]
    # refused: a float parameter would take integer or boolean values silently (a cast)
    mistyped = [f"{key}: {str(state_dict[key].dtype).removeprefix('torch.')}"
                for key in sorted(set(expected) & set(state_dict))
                if not kind_fits(state_dict[key], expected[key])]
    if missing or unexpected or mismatched or mistyped:
        lines = [f"the weights from {source} do not fit the model ({type(model).__name__}, "
                 f"{model.config.stem} stem):"]
        for title, items in (("missing", missing), ("unexpected", unexpected),
                             ("mis-shaped", mismatched),
                             ("not floating-point where the model has floats", mistyped)):
            if items:
                more = " ..." if len(items) > 20 else ""
                lines.append(f"  {title} ({len(items)}): " + ", ".join(items[:20]) + more)
        lines.append("  check that the model name matches the checkpoint, or pass strict=False to "
                     "load what fits")
        raise CheckpointError("\n".join(lines))


HEAD_OPTIONS = ("num_classes", "head", "head_options")


def decided_options(decided: dict[str, Any], requested: dict[str, Any]) -> dict[str, Any]:
    """The options the weights decide (`decided`: act, norm_eps, pool, head, ...) unless the user
    asked otherwise (`requested`); another number of classes or another head asked for replaces the
    weights' head by a zero-initialised linear one (the model then drops its head's weights)."""
    changes: dict[str, Any] = {}
    for option, value in decided.items():
        if option in HEAD_OPTIONS or option not in requested or requested[option] == value:
            changes[option] = value
        elif isinstance(value, dict) and isinstance(requested[option], dict):  # a part's options
            asked = requested[option]
            clash = [k for k in value if k in asked and asked[k] != value[k]]
            if clash:
                raise ConfigError(f"the checkpoint has {option}[{clash[0]!r}]={value[clash[0]]!r} "
                                  f"but {requested[option][clash[0]]!r} was requested; drop it to "
                                  "load these weights")
            changes[option] = value
        elif option not in USER_OVERRIDABLE:
            raise ConfigError(
                f"the checkpoint has {option}={value!r} but {option}={requested[option]!r} was "
                f"requested; drop the {option} option to load these weights"
            )
    drop_head = any(o in requested and o in decided and requested[o] != decided[o]
                    for o in ("num_classes", "head"))
    if drop_head:
        # as the paper's fine-tuning: head and pre-logits become one zero-initialised linear layer
        head = requested.get("head", "linear")
        changes.update(
            num_classes=requested.get("num_classes", decided.get("num_classes")),
            head=head,
            head_options=requested.get("head_options", {}) if head != "linear" else {},
        )
    return changes
