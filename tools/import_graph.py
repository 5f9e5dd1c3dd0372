"""The import graph of hvdlite's own modules, and its cycles.

Every ``import`` statement counts, at module level or inside a function: a
function-local import only delays a dependency, it does not remove it.  An
edge goes from the importing module to the hvdlite module it names (for
``from package import name``, to ``package.name`` when that is a module).  A
package's implicit import by its submodules is not an edge; importing the
package by name (``import hvdlite``) is.

Besides cycles it checks the layering (:func:`layering_violations`).  hvdlite's
modules sit on the layers of :data:`LAYERS`, top first: the front doors, Keras 3,
the framework adapters and the launcher, the API, the engine, the transports,
and at the bottom device memory and the leaves.  A module may import its own
layer and the layers below it, never one above.  Two rules come on top:

- the framework adapters and the launcher import nothing from ``hvdlite.engine``:
  they reach it through the public modules and the seams ``hvdlite.basics`` and
  ``hvdlite.collectives`` name for them;
- device memory (``hvdlite.device``) imports nothing from ``hvdlite.engine``.

A module that no layer names is a violation too: a new module is placed on
purpose.

Run ``python tools/import_graph.py`` to print the cycles and violations (exit 1
when there are any); ``make lint`` does, and
``tests/test_import_graph_layers_unit.py`` asserts none.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "hvdlite"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [
                f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` names module a.b.c
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
    return edges


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: _imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(1000, 10 * len(edges)))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


#: hvdlite's layers, top first: (name, the modules on it).  A name stands for
#: that module and its submodules, a name ending in ``=`` for that module only; a
#: module is on the layer of the longest name that matches it.
LAYERS = (
    # hvdlite.DistributedOptimizer and hvdlite.run pick the adapter or start the
    # launcher; hvdlite.tensorflow's DistributedOptimizer takes Keras optimizers too.
    (
        "front doors",
        (
            "hvdlite=",
            "hvdlite._dispatch",
            "hvdlite.tensorflow=",
            "hvdlite.tensorflow.keras",
            # the `horovod` package hvdrun --as-horovod puts on the ranks' path
            "hvdlite.horovod_compat.horovod",
        ),
    ),
    ("Keras 3", ("hvdlite.keras",)),
    (
        "adapters and launcher",
        (
            "hvdlite.torch",
            "hvdlite.tensorflow",
            "hvdlite.jax",
            "hvdlite.lightning",
            "hvdlite.runner",
            "hvdlite.horovodrun",
        ),
    ),
    (
        "API",
        (
            "hvdlite.basics",
            "hvdlite.common",
            "hvdlite.collectives",
            "hvdlite._checks",
            "hvdlite.objects",
            "hvdlite.handles",
            "hvdlite.dynamic_sets",
            "hvdlite._optimizer_args",
            "hvdlite._subclass",
            "hvdlite.elastic",
            "hvdlite.autotune",
            "hvdlite.timeline",
        ),
    ),
    ("engine", ("hvdlite.engine",)),
    ("transports", ("hvdlite.engine.transports",)),
    (
        "device memory and leaves",
        (
            "hvdlite.device",
            "hvdlite.util",
            "hvdlite.exceptions",
            "hvdlite.ops",
            "hvdlite.config",
            "hvdlite.version",
            "hvdlite.process_sets",
            "hvdlite.compression",
            "hvdlite.start_report",
            "hvdlite.horovod_compat",  # its path and version, for hvdrun
            # values every layer passes around: a batch's requests and responses,
            # and the names of a timeline's phases
            "hvdlite.engine.messages",
            "hvdlite.timeline.schema",
        ),
    ),
)

#: Packages that must not import the engine.
ADAPTERS = (
    "hvdlite.torch",
    "hvdlite.tensorflow",
    "hvdlite.keras",
    "hvdlite.jax",
    "hvdlite.lightning",
    "hvdlite.runner",
)
ENGINE = "hvdlite.engine"
DEVICE = "hvdlite.device"


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The index in *layers* (0 = top) of *module*'s layer, or None when none names it."""
    best, best_len = None, -1
    for index, (_, names) in enumerate(layers):
        for name in names:
            exact = name.endswith("=")
            name = name.rstrip("=")
            hit = module == name if exact else _within(module, (name,))
            if hit and len(name) > best_len:
                best, best_len = index, len(name)
    return best


def layering_violations(edges: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """One line per import that crosses the layers the wrong way, and per module
    that no layer names."""
    found = []
    for source in sorted(edges):
        mine = layer_of(source, layers)
        if mine is None:
            found.append(f"{source} is on no layer: add it to LAYERS in tools/import_graph.py")
            continue
        for target in sorted(edges[source]):
            theirs = layer_of(target, layers)
            if _within(source, ADAPTERS) and _within(target, (ENGINE,)):
                found.append(
                    f"{source} imports {target}: adapters reach the engine through "
                    "hvdlite.basics / hvdlite.collectives, not hvdlite.engine"
                )
            elif _within(source, (DEVICE,)) and _within(target, (ENGINE,)):
                found.append(
                    f"{source} imports {target}: device memory sits below the engine "
                    "and imports nothing of it"
                )
            elif theirs is not None and theirs < mine:
                found.append(
                    f"{source} imports {target}: an import up, from the "
                    f"{layers[mine][0]} layer to the {layers[theirs][0]} layer"
                )
    return found


def main() -> int:
    edges = graph()
    found = cycles(edges)
    for component in found:
        print("import cycle among:", ", ".join(component))
    if not found:
        print("no import cycles among hvdlite's modules")
    wrong = layering_violations(edges)
    for line in wrong:
        print("layering:", line)
    if not wrong:
        print("no import crosses hvdlite's layers the wrong way")
    return 1 if found or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
