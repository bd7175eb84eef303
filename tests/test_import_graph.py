"""The floor plan of the package, read from its code: no import circle, every module in its layer,
every import going down or sideways, no module too long.

The graph is read with `ast` from every import of `vitzoo/` and `benchmarks/`, those inside
functions too; only imports under `if TYPE_CHECKING:` are left out (nothing runs them).
`LAYERS` is the plan; docs/architecture.md's table is rendered from it
(`python tests/test_import_graph.py` writes it).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "vitzoo"
PACKAGES = (PACKAGE, "benchmarks")
LINE_LIMIT = 400
ARCHITECTURE = ROOT / "docs" / "architecture.md"
START, END = "<!-- layers:start -->", "<!-- layers:end -->"


class Layer(NamedTuple):
    """One floor of the plan: its modules by path (a folder `x/` places every module below it; the
    longest path that holds a module places it), each with what it is."""

    name: str
    says: str
    modules: dict[str, str]


LAYERS: tuple[Layer, ...] = (
    Layer("Leaves", "they import nothing of vitzoo but other leaves", {
        "vitzoo/errors.py": "every error vitzoo raises on purpose, the one place to import them from",
        "vitzoo/options.py": "the `Options` base and its one validator, driven by the fields' metadata",
        "vitzoo/config.py": "`ViTConfig`: every option of a model, plain data with the option name lists, the single "
                            "source of truth a component receives",
        "vitzoo/io.py": "atomic writes, and the cache folder",
        "vitzoo/envvars.py": "vitzoo's environment variables, read one way: a value that means nothing is refused",
        "vitzoo/argvalues.py": "the command lines' parser: an empty or blank value is refused, naming its option",
        "vitzoo/version.py": "the version",
        "vitzoo/precision.py": "numeric precision: --precision's names and dtypes, the rule of which one a device "
                               "computes fastest in (a GPU's bf16 support, a CPU's flags), the one autocast "
                               "context, the dtype of sums kept on a device",
        "vitzoo/flags.py": "command-line flags from an options dataclass's fields",
        "vitzoo/weights/layout.py": "the names of the files a model directory or Hub repo holds, the Hub prefix, "
                                    "the token grid",
    }),
    Layer("Types a plugin provides", "the contracts every component and weight format is written to", {
        "vitzoo/hookspecs.py": "one typed hook per extension point, the docstring is the contract",
        "vitzoo/weights/__init__.py": "`WeightFormat`, what a format implements, and the `ConvertedWeights` it "
                                      "returns; whether weights fit a model",
    }),
    Layer("Built-in parts", "registered through the hooks exactly as a plugin's are", {
        "vitzoo/layers/": "the built-in parts of eq. (1)-(4): stems, the BiT ResNet, position embeddings, pooling "
                          "and heads",
        "vitzoo/zoo.py": "the table: Table 1's named models with timm's names, and the released weights, one "
                         "`PretrainedTag` each (Hub repo, preprocessing, class names, accuracy), as torchvision's Weights",
        "vitzoo/weights/": "weights in and out: the formats, one module each (`official`, `torchvision`; `timm` and "
                           "`transformers` both ways; `native`, vitzoo's own directory), `files` (reading any of them "
                           "safely), `infer` (the model a state dict describes), `card` (which library loads a model, "
                           "its model card), `publish` and `hub` (the Hub both ways, hashes checked, no call waiting "
                           "for ever)",
        "vitzoo/builtins.py": "all of the above, registered as one plugin",
    }),
    Layer("The registry", "it imports the built-ins and the hookspecs", {
        "vitzoo/registry.py": "the pluggy manager (third-party plugins from the entry-point group `vitzoo`), and every "
                              "name: components, models, tags (timm's names too), weight formats; a config resolved",
    }),
    Layer("The model", "what is built from the registry", {
        "vitzoo/model.py": "`VisionTransformer`: eq. (1)-(4) with the encoder and the attention, each part "
                           "looked up by name",
        "vitzoo/timm_surface.py": "the model's base: what a timm user reaches for, by timm's names",
        "vitzoo/features.py": "`FeatureExtractor` and `FeatureInfo`: the feature maps of `create(..., features_only=True)`",
    }),
    Layer("Lookups and orchestration", "the model a name or a source describes", {
        "vitzoo/factory.py": "`create`, `from_pretrained`: a name or a source resolved into a config and weights "
                             "once, then built",
        "vitzoo/__init__.py": "the public face: `create`, `from_pretrained`, `list_*`, `count_*`",
        "vitzoo/inference.py": "`for_inference`: the model in its device's fastest precision, its attention kernel "
                               "chosen for it, compiled if asked",
        "vitzoo/export.py": "`export_onnx`: a model as an ONNX file through torch's exporter, checked with onnxruntime",
    }),
    Layer("Training and evaluation", "what is done with a model", {
        "vitzoo/data/": "`folders`: where images come from (named datasets, image folders, synthetic) and "
                        "the splits cut from them; `named`: the datasets torchvision fetches (`--download`); "
                        "`shards`: WebDataset tar shards read at random, `sharding` writes them; `transforms`: "
                        "decoding, augmentation, normalisation, and decoding on the training device; `workers`: "
                        "how a loader starts its workers",
        "vitzoo/train/": "`config`: the knobs and recipes; `loop`: the `Trainer`; `inputs`: data, "
                         "loaders and evaluation passes; `optim`: parameter groups, schedule, EMA; "
                         "`checkpoint`: exact resume and the run directory; `report`: metrics and "
                         "summary.json; `distributed`: processes, devices, signals",
        "vitzoo/evaluate.py": "top-1 and top-5 accuracy, the paper's few-shot linear evaluation, a linear probe",
        "vitzoo/analysis.py": "looking inside a trained ViT (section 4.5)",
    }),
    Layer("The command line", "the `vitzoo` command", {
        "vitzoo/cli.py": "the parser, one subcommand a module",
        "vitzoo/__main__.py": "`python -m vitzoo`",
        "vitzoo/commands/": "`train` and `eval`, `predict`, `list` and `info`, `push`, `pull` and `convert`, `export`, `shard`, `bench`",
    }),
    Layer("The benchmarks", "beside the package: they import it, it never imports them", {
        "benchmarks/ablations/": "the {ablations}, one declarative spec each",
        "benchmarks/": "the framework that plans, runs and judges them, and the benchmarks that are not ablations "
                       "([below](#the-benchmarks))",
    }),
)


def module_names(packages: str | tuple[str, ...] = PACKAGE) -> dict[str, Path]:
    """Every module of the packages by its dotted name (a package by its own, for its __init__.py)."""
    modules = {}
    for package in (packages,) if isinstance(packages, str) else packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Imports(ast.NodeVisitor):
    """The modules of the package that one module imports, at any depth of its code."""

    def __init__(self, name: str, is_package: bool, modules: dict[str, Path], type_checking: bool) -> None:
        self.name, self.modules, self.type_checking = name, modules, type_checking
        self.package = name if is_package else name.rpartition(".")[0]
        self.found: set[str] = set()

    def _known(self, dotted: str) -> str | None:
        """The module `dotted` names, or the package it is an attribute of."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in self.modules:
                return candidate
        return None

    def _add(self, dotted: str) -> None:
        target = self._known(dotted)
        if target is not None and target != self.name:
            self.found.add(target)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test) and not self.type_checking:
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:
            submodule = f"{module}.{alias.name}"
            self._add(submodule if submodule in self.modules else module)


def import_graph(type_checking: bool = False, packages: str | tuple[str, ...] = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of the packages it imports."""
    modules = module_names(packages)
    graph = {}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py", modules, type_checking)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        graph[name] = visitor.found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles (a -> b -> ... -> a) a depth-first walk of `graph` meets, one per edge back."""
    found, done = [], set()

    def walk(path: list[str]) -> None:
        for target in sorted(graph[path[-1]]):
            if target in path:
                found.append(path[path.index(target):] + [target])
            elif target not in done:
                walk(path + [target])
        done.add(path[-1])

    for node in sorted(graph):
        if node not in done:
            walk([node])
    return found


def placement(path: str, layers: tuple[Layer, ...] = LAYERS) -> tuple[int, str] | None:
    """The layer (its index in `layers`) and the row of the table that place the module at `path` (from
    the repository's root, as `vitzoo/weights/hub.py`): the longest path of the table that holds it."""
    held = [(len(key), index, key) for index, layer in enumerate(layers) for key in layer.modules
            if path == key or (key.endswith("/") and path.startswith(key))]
    return max(held)[1:] if held else None


def climbs(graph: dict[str, set[str]], paths: dict[str, str],
           layers: tuple[Layer, ...] = LAYERS) -> list[str]:
    """Every import of `graph` (dotted names; `paths` gives each module's path) that goes up the
    plan, as `a (layer) -> b (layer)`."""
    found = []
    for source, targets in sorted(graph.items()):
        here = placement(paths[source], layers)[0]
        for target in sorted(targets):
            there = placement(paths[target], layers)[0]
            if there > here:
                found.append(f"{source} ({layers[here].name}) -> {target} ({layers[there].name})")
    return found


def layer_table(layers: tuple[Layer, ...] = LAYERS) -> str:
    """docs/architecture.md's layer table: one row a path, each layer named in its first row; the
    ablations counted and named from their registry."""
    from benchmarks.ablations import ABLATIONS

    ablations = f"{len(ABLATIONS)} ablations ({', '.join(f'`{name}`' for name in ABLATIONS)})"
    lines = ["From the ground up: a module imports from its own layer and the layers below it, never from one "
             "above; the longest path in the table that holds a module places it. No module is over "
             f"{LINE_LIMIT} lines.", "",
             "| layer | module | what it is |", "| --- | --- | --- |"]
    for number, layer in enumerate(layers, 1):
        for row, (path, what) in enumerate(layer.modules.items()):
            name = f"**{number}. {layer.name}**: {layer.says}" if row == 0 else ""
            lines.append(f"| {name} | `{path}` | {what.replace('{ablations}', ablations)} |")
    return "\n".join(lines)


def with_layer_table(text: str) -> str:
    """`text` (docs/architecture.md) with the table between its markers rendered anew."""
    assert START in text and END in text, f"docs/architecture.md lost its markers {START} {END}"
    return re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{layer_table()}\n{END}", text,
                  flags=re.S)


def test_no_import_circle():
    """None in vitzoo/ or in benchmarks/, and none through the model module even counting
    type-only imports."""
    found = circles(import_graph()) + circles(import_graph(packages="benchmarks"))
    found += [c for c in circles(import_graph(type_checking=True)) if "vitzoo.model" in c]
    assert not found, "import circles (outside `if TYPE_CHECKING:`):\n" + "\n".join(
        " -> ".join(circle) for circle in found)


def test_the_graph_is_read_from_the_code():
    """The reader sees what the rules above are about: an import inside a function, a relative import,
    a submodule named in `from a import b`; and it leaves type-only imports out."""
    graph = import_graph()
    assert {"vitzoo.model", "vitzoo.registry"} <= set(graph)
    assert "vitzoo.registry" in graph["vitzoo.model"]
    assert "vitzoo.weights.publish" in graph["vitzoo.commands.weights"]  # inside run_push
    assert "vitzoo.weights.hub" in graph["vitzoo.weights.files"]  # from vitzoo.weights import hub
    assert "vitzoo.config" not in graph["vitzoo.hookspecs"]  # under if TYPE_CHECKING
    assert "vitzoo.config" in import_graph(type_checking=True)["vitzoo.hookspecs"]
    assert circles({"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "a"], ["a", "b", "c", "a"]]


def test_every_module_stands_in_one_layer():
    """Every module of vitzoo/ and benchmarks/ is placed by a row of the table, every row places a
    module (no row outlives its module), and no path stands in two layers."""
    paths = [path.relative_to(ROOT).as_posix() for path in module_names(PACKAGES).values()]
    unplaced = [path for path in paths if placement(path) is None]
    assert not unplaced, f"modules in no layer of LAYERS: {unplaced}; add each to its layer"
    rows = [key for layer in LAYERS for key in layer.modules]
    unused = set(rows) - {placement(path)[1] for path in paths}
    assert not unused, f"rows of LAYERS that place no module: {sorted(unused)}"
    assert len(rows) == len(set(rows)), "a path stands in two layers"


def test_every_import_goes_down_or_sideways():
    graph = import_graph(packages=PACKAGES)
    paths = {name: p.relative_to(ROOT).as_posix() for name, p in module_names(PACKAGES).items()}
    assert "vitzoo" in graph["benchmarks.training"]  # the imports between the two packages count
    found = climbs(graph, paths)
    assert not found, "imports that climb LAYERS:\n" + "\n".join(found)


def test_a_climb_is_caught():
    """The rule above can fail; the longest path of the table places a module."""
    layers = (Layer("Ground", "", {"p/a.py": "", "p/b/low.py": ""}),
              Layer("Middle", "", {"p/b/": ""}))
    paths = {"a": "p/a.py", "low": "p/b/low.py", "b": "p/b/mid.py"}
    graph = {"a": {"b", "low"}, "low": set(), "b": {"a"}}
    assert placement("p/b/low.py", layers) == (0, "p/b/low.py")
    assert placement("p/b/mid.py", layers) == (1, "p/b/")
    assert climbs(graph, paths, layers) == ["a (Ground) -> b (Middle)"]
    assert "| **2. Middle**:  | `p/b/` |  |" in layer_table(layers)


def test_the_docs_layer_table_is_the_layers():
    """docs/architecture.md shows the plan this test checks: its table is rendered from LAYERS."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert with_layer_table(text) == text, "docs/architecture.md's layer table is not the one LAYERS " \
        "renders: run `python tests/test_import_graph.py` to write it"


def test_no_module_takes_the_name_of_a_standard_library_module():
    """One read from a file (not compiled in or frozen) would be shadowed for any script run from
    inside the module's folder."""
    names = {name.rpartition(".")[2] for name in module_names()}
    clashes = names & set(sys.stdlib_module_names)
    shadowable = {name for name in clashes
                  if (spec := importlib.util.find_spec(name)) is not None and spec.origin not in ("built-in", "frozen")}
    assert not shadowable, shadowable


def test_no_module_is_longer_than_the_limit():
    """Short modules with one job each: none of vitzoo/ or benchmarks/ over LINE_LIMIT lines."""
    modules = module_names(PACKAGES)
    long = {str(path.relative_to(ROOT)): lines for path in modules.values()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > LINE_LIMIT}
    assert len(modules) > 50 and not long, f"modules over {LINE_LIMIT} lines: {long}"


if __name__ == "__main__":  # docs/architecture.md's layer table, written from LAYERS
    sys.path.insert(0, str(ROOT))
    from vitzoo.io import write_text

    write_text(ARCHITECTURE, with_layer_table(ARCHITECTURE.read_text(encoding="utf-8")))
    print(f"wrote the layer table of {ARCHITECTURE.relative_to(ROOT)}")
