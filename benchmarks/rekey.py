"""Rewrite the committed records and configs under benchmarks/results in today's option names, once.

The ResNet stem's and the MLP head's options were once model options of their own (`resnet_layers`,
`resnet_width`, `resnet_numerics`, `representation_size`), and run keys hashed them so. This script
moves them into their part's dict (`stem_options`, `head_options`) in every run config, model config
and throughput-probe key, and gives each run record the key `benchmarks.suite.Run.key` computes for it
now, in every file that names it. No measurement changes.

    python -m benchmarks.rekey            # rewrites the files in place; prints what it changed
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.suite import COMMITTED_THREADS, RESULTS, Run
from vitzoo.io import write_text
from vitzoo.registry import get_registry

# the names, by part: (part, the component that owned them, its option's name, the default)
RENAMED = {
    "resnet_layers": ("stem", "resnet", "layers", ()),
    "resnet_width": ("stem", "resnet", "width", 1),
    "resnet_numerics": ("stem", "resnet", "numerics", "official"),
    "representation_size": ("head", "mlp", "representation_size", None),
}
PART_OPTIONS = {"stem": "stem_options", "head": "head_options"}
DEFAULT_PART = {"stem": "patch", "head": "linear"}


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a) == json.dumps(b)


def nested(options: dict[str, Any], full: bool = False) -> dict[str, Any]:
    """`options` with the renamed options in their part's dict, at the place of the first one. The part
    is the one named, else its owner (a run's options change a model, whose part is the owner), or for a
    full model config, the default part. `full`: a whole model config, whose every part gets its dict
    (complete, as a resolved config holds it) and whose options of an unchosen part are at their default."""
    if not RENAMED.keys() & options.keys():
        return options
    moved: dict[str, dict[str, Any]] = {}
    for name, (part, owner, option, default) in RENAMED.items():
        if name not in options:
            continue
        chosen = options.get(part, DEFAULT_PART[part] if full else owner)
        if chosen == owner:
            moved.setdefault(part, {})[option] = options[name]
        elif not _same(options[name], default):
            raise ValueError(f"{name}={options[name]!r} with {part}={chosen!r}")
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key in RENAMED:
            part = RENAMED[key][0]
            if full or part in moved:
                given = options.get(PART_OPTIONS[part]) or {}
                out[PART_OPTIONS[part]] = _complete(part, options, {**moved.get(part, {}), **given}, full)
        elif key not in PART_OPTIONS.values() or key not in out:
            out[key] = value
    return out


def _complete(part: str, options: dict[str, Any], given: dict[str, Any], full: bool) -> dict[str, Any]:
    """A full config's part options as today's resolved config writes them (every option, JSON form)."""
    if not full:
        return given
    component = get_registry().get(part, options.get(part, DEFAULT_PART[part]))
    declared = getattr(component, "Options", None)
    return json.loads(json.dumps(declared.from_dict(given).to_dict())) if declared is not None else given


def _old_key(record: dict[str, Any], config: dict[str, Any], threads: int | None) -> str:
    """The key the record was written under: its options with the renamed ones taken out of their dicts."""
    options = dict(config["options"])
    for name, (part, owner, option, _default) in RENAMED.items():
        key = PART_OPTIONS[part]
        if isinstance(options.get(key), dict) and option in options[key] and options.get(part, owner) == owner:
            inner = dict(options[key])
            options[name] = inner.pop(option)
            if inner:
                options[key] = inner
            else:
                del options[key]
    fields = {"ablation": record["ablation"], "config": {**config, "options": options}, "seed": record["seed"]}
    if threads is not None and threads != COMMITTED_THREADS:
        fields["threads"] = threads
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def rewrite(value: Any, keys: dict[str, str]) -> Any:
    """`value` with every config in today's names; the old -> new key of each run record into `keys`."""
    if isinstance(value, list):
        return [rewrite(v, keys) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: rewrite(v, keys) for k, v in value.items()}
    if isinstance(out.get("model_config"), dict):
        out["model_config"] = nested(out["model_config"], full=True)
    if isinstance(out.get("model_options"), dict):
        out["model_options"] = nested(out["model_options"])
    config = out.get("config")
    if isinstance(config, dict) and isinstance(config.get("options"), dict):
        out["config"] = {**config, "options": nested(config["options"])}
        if {"key", "ablation", "seed"} <= out.keys():
            threads = [t for t in (None, out.get("threads")) if _old_key(out, config, t) == out["key"]]
            if threads:  # (else a key of another form, which the record's archive reason explains)
                new = Run(out["ablation"], out.get("label", ""), out["config"], out["seed"], threads=threads[0]).key
                if new != out["key"]:
                    keys[out["key"]] = out["key"] = new
    return out


def _probe_key(text: str) -> str:
    key = json.loads(text)
    return json.dumps({**key, "options": nested(key["options"])}, sort_keys=True)


def _sorted(text: str) -> bool:
    """Whether a file was written with its keys sorted (as the results stores are)."""
    return json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n" == text


def main() -> int:
    keys: dict[str, str] = {}
    files = sorted(RESULTS.rglob("*.json"))
    documents = {}
    for path in files:
        text = path.read_text()
        document = rewrite(json.loads(text), keys)
        if path.parent.name == "plan" and "images_per_s" in document:
            document["images_per_s"] = {_probe_key(k): v for k, v in document["images_per_s"].items()}
        documents[path] = (text, document)
    for path, (text, document) in documents.items():
        new = json.dumps(document, indent=1, sort_keys=_sorted(text)) + "\n"
        for old, key in keys.items():  # the files that name a run by its key (rerun checks, archives)
            new = new.replace(f'"{old}"', f'"{key}"')
        for name, (part, _owner, option, _default) in RENAMED.items():  # the archive's reasons
            new = new.replace(f"options.{name}:", f"options.{PART_OPTIONS[part]}.{option}:")
        if new != text:
            write_text(path, new)
            print(f"{path.relative_to(RESULTS.parent.parent)}", file=sys.stderr)
    print(f"{len(keys)} run keys changed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
