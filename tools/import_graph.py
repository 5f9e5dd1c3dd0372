"""The import graph of hvdlite's own modules, and its cycles.

Every ``import`` statement counts, at module level or inside a function: a
function-local import only delays a dependency, it does not remove it.  An
edge goes from the importing module to the hvdlite module it names (for
``from package import name``, to ``package.name`` when that is a module).  A
package's implicit import by its submodules is not an edge; importing the
package by name (``import hvdlite``) is.

Besides cycles it checks the layering (:func:`layering_violations`):

- the framework adapters and the launcher (``hvdlite.torch``,
  ``hvdlite.tensorflow``, ``hvdlite.keras``, ``hvdlite.jax``, ``hvdlite.runner``) import nothing
  from ``hvdlite.engine``: they reach it through the public modules and the
  seams ``hvdlite.basics`` and ``hvdlite.collectives`` name for them;
- the engine imports only itself and the modules below it: the value modules
  of the API (exceptions, ops, config, process sets), the device path, the
  timeline's schema; never the API that drives it (basics, collectives, ...)
  nor an adapter.

Run ``python tools/import_graph.py`` to print the cycles and violations (exit 1
when there are any); ``make lint`` does, and ``tests/test_core_unit.py``
asserts none.
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


#: Packages that must not import the engine.
ADAPTERS = ("hvdlite.torch", "hvdlite.tensorflow", "hvdlite.keras", "hvdlite.jax", "hvdlite.runner")
ENGINE = "hvdlite.engine"
#: What the engine may import besides itself (a module or a package's modules).
ENGINE_MAY_IMPORT = (
    "hvdlite.exceptions",
    "hvdlite.ops",
    "hvdlite.config",
    "hvdlite.process_sets",
    "hvdlite.device",
    "hvdlite.timeline.schema",
)


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layering_violations(edges: dict[str, set[str]]) -> list[str]:
    """One line per import that crosses the layers the wrong way."""
    found = []
    for source in sorted(edges):
        for target in sorted(edges[source]):
            if _within(source, ADAPTERS) and _within(target, (ENGINE,)):
                found.append(
                    f"{source} imports {target}: adapters reach the engine through "
                    "hvdlite.basics / hvdlite.collectives, not hvdlite.engine"
                )
            elif _within(source, (ENGINE,)) and not _within(target, (ENGINE, *ENGINE_MAY_IMPORT)):
                found.append(
                    f"{source} imports {target}: the engine imports only itself and "
                    f"{', '.join(ENGINE_MAY_IMPORT)}"
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
