"""Weights in and out, one module per format: `official`, `torchvision`, `timm` and `transformers`
(both ways), `native` (vitzoo's own); `files` reads any of them safely, `infer` gives the model a
state dict describes, `card` and `publish` write and push, `hub` is the Hub. A format is a
`WeightFormat`, registered through the hook `vitzoo_weight_formats`, whose `convert` returns
`ConvertedWeights`: vitzoo's names and the options the weights decide.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from vitzoo.errors import CheckpointError, ConfigError

Metadata = Mapping[str, dict]  # the JSON files beside the weights by name (config.json, ...)
HEAD_OPTIONS = ("num_classes", "head", "head_options")


@dataclass
class ConvertedWeights:
    """Weights in vitzoo's names, their format, and the options they decide."""

    format: str
    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any] = field(default_factory=dict)  # act, norm_eps, pool, head, ...
    grid: tuple[int, int] | None = None  # the token grid of the position embeddings


class WeightFormat:
    """A checkpoint format: `name` (its registered name), how to recognise it and convert it. No
    two formats may recognise the same weights."""

    name: str = ""
    marks: tuple[str, ...] = ()  # tensor names every checkpoint of the format has

    def recognises(self, keys: Collection[str], metadata: Metadata) -> bool:
        return bool(self.marks) and set(self.marks) <= set(keys)

    def convert(self, state_dict: Mapping[str, Any], metadata: Metadata) -> ConvertedWeights:
        """vitzoo's names, with tensors the format does not know kept for the strict loader."""
        raise NotImplementedError

    def hints(self, metadata: Metadata) -> dict[str, Any]:
        """Options the weights cannot decide (image size, normalisation) for an inferred model."""
        return {}

    def labels(self, metadata: Metadata) -> list[str] | None:
        """The classifier's class names, when the metadata gives them."""
        return None


@contextmanager
def converting(fmt: str, source: str):
    """A tensor the converter needs but the file lacks: an incomplete file, not a KeyError."""
    try:
        yield
    except KeyError as exc:
        raise CheckpointError(f"{source} has the names of a {fmt} checkpoint but lacks the tensor "
                              f"{exc.args[0]!r}: save or download it again") from None


def take_head(params: dict, out: dict, config: dict, pre_logits: str, classifier: str) -> None:
    """A PyTorch-layout head (optional pre-logits Dense + tanh, then the classifier) moved to
    vitzoo's names, and the options it decides: head, representation_size, num_classes."""
    if f"{pre_logits}.weight" in params:
        out["head.pre_logits.weight"] = weight = params.pop(f"{pre_logits}.weight")
        out["head.pre_logits.bias"] = params.pop(f"{pre_logits}.bias")
        config.update(head="mlp", head_options={"representation_size": int(weight.shape[0])})
    else:
        config.update(head="linear", head_options={})
    config["num_classes"] = 0
    if f"{classifier}.weight" in params:
        out["head.fc.weight"] = weight = params.pop(f"{classifier}.weight")
        out["head.fc.bias"] = params.pop(f"{classifier}.bias")
        config["num_classes"] = int(weight.shape[0])


def fits(tensor: torch.Tensor, expected: torch.Tensor) -> bool:
    """Same shape, and a float where the model has one (integers are never cast into weights)."""
    return tensor.shape == expected.shape and (tensor.is_floating_point()
                                               or not expected.is_floating_point())


def check_state_dict(model: torch.nn.Module, state_dict: dict, source: str) -> None:
    """A CheckpointError listing every tensor missing, unexpected, mis-shaped or not a float."""
    expected = model.state_dict()
    both = sorted(set(expected) & set(state_dict))
    found = {
        "missing": sorted(set(expected) - set(state_dict)),
        "unexpected": sorted(set(state_dict) - set(expected)),
        "mis-shaped": [f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model "
                       f"{tuple(expected[k].shape)}" for k in both
                       if state_dict[k].shape != expected[k].shape],
        "not floating-point": [f"{k}: {str(state_dict[k].dtype).removeprefix('torch.')}"
                               for k in both if state_dict[k].shape == expected[k].shape
                               and not fits(state_dict[k], expected[k])],
    }
    lines = [f"  {what} ({len(keys)}): {', '.join(keys[:20])}{' ...' * (len(keys) > 20)}"
             for what, keys in found.items() if keys]
    if lines:
        raise CheckpointError("\n".join([f"the weights from {source} do not fit the model:", *lines,
                                         "  check the model name, or pass strict=False to load "
                                         "what fits"]))


def decided_options(decided: dict[str, Any], requested: dict[str, Any]) -> dict[str, Any]:
    """What the weights decide, unless asked otherwise: the numerics (act, norm_eps) may be
    changed, another head replaces theirs (zero-initialised, linear unless named), any other
    difference is refused."""
    changes = {}
    for option, value in decided.items():
        asked = requested.get(option, value)
        if option in HEAD_OPTIONS or asked == value:
            changes[option] = value
        elif isinstance(value, dict) and isinstance(asked, dict):  # a part's options
            clash = next((k for k in value if k in asked and asked[k] != value[k]), None)
            if clash is not None:
                raise ConfigError(f"the checkpoint has {option}[{clash!r}]={value[clash]!r} but "
                                  f"{asked[clash]!r} was requested; drop it to load these weights")
            changes[option] = value
        elif option not in ("act", "norm_eps"):
            raise ConfigError(f"the checkpoint has {option}={value!r} but {option}={asked!r} was "
                              f"requested; drop the {option} option to load these weights")
    if any(o in requested and o in decided and requested[o] != decided[o]
           for o in ("num_classes", "head")):
        head = requested.get("head", "linear")
        changes.update(num_classes=requested.get("num_classes", decided.get("num_classes")),
                       head=head, head_options=requested.get("head_options", {})
                       if head != "linear" else {})
    return changes
