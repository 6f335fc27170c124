"""No import cycles between the top-level parts of `autoglm_serve`.

Granularity: the *subpackage* (`engine`, `multimodal`, `kernels`, `models`,
`server`, `loader`, `bench`, `entrypoints`). Inside one subpackage modules may
import each other freely; across subpackages the imports must form a DAG, so
that e.g. `engine -> multimodal -> engine` fails. The top-level modules next to
the subpackages (`config`, `sampling_params`, `llm`, ...) each count as a node of
their own; `autoglm_serve/__init__.py` is none: it only re-exports. Module-level
and function-level imports both count: a lazy import inside a function still
ties the two packages together.
"""

import ast
from pathlib import Path

PACKAGE = "autoglm_serve"
PACKAGE_DIR = Path(__file__).resolve().parent.parent / PACKAGE


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every `autoglm_serve.*` name that `module`'s source imports, relative ones resolved."""
    # A relative import is relative to the module's own package (itself for an __init__).
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
            # `from pkg import sub` may name a submodule: count it as `pkg.sub`.
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def _part(module: str) -> str | None:
    """The top-level part a module belongs to (`autoglm_serve.engine.core` -> `engine`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def part_graph() -> dict[str, dict[str, list[str]]]:
    """part -> imported part -> the `importer -> imported` module edges behind it."""
    known = {_module_name(p) for p in PACKAGE_DIR.rglob("*.py")}
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        importer = _module_name(path)
        source = _part(importer)
        if source is None:
            continue
        graph.setdefault(source, {})
        imported_names = imports_of(path.read_text(), importer, path.name == "__init__.py")
        for imported in sorted(imported_names):
            if imported not in known:  # `pkg.name` where `name` is not a module
                continue
            target = _part(imported)
            if target is not None and target != source:
                graph[source].setdefault(target, []).append(f"{importer} -> {imported}")
    return graph


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle in a directed graph as [a, b, ..., a], or None."""
    on_path: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in on_path:
            return on_path[on_path.index(node) :] + [node]
        if node in done:
            return None
        on_path.append(node)
        for nxt in sorted(edges.get(node, ())):
            cycle = visit(nxt)
            if cycle:
                return cycle
        on_path.pop()
        done.add(node)
        return None

    for start in sorted(edges):
        cycle = visit(start)
        if cycle:
            return cycle
    return None


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle for each group of nodes that all reach each other (strongly connected
    component), so that every independent cycle is reported at once, not only the first."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reaches = {node: reach(node) for node in edges}
    cycles, covered = [], set()
    for node in sorted(edges):
        if node in covered or node not in reaches[node]:
            continue
        group = {other for other in reaches[node] if node in reaches.get(other, ())}
        covered |= group
        cycles.append(find_cycle({a: edges[a] & group for a in group}))
    return cycles


def test_find_cycles_finds_each_and_rejects_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    two = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}
    assert find_cycles(two) == [["a", "b", "a"], ["c", "d", "c"]]
    dag = {"a": {"b", "c"}, "b": {"c"}, "c": set()}
    assert find_cycle(dag) is None and find_cycles(dag) == []


def test_imports_resolve_relative_and_function_level():
    source = """
import os
from autoglm_serve.engine import core
from . import request
from ..multimodal.inputs import MultiModalItem

def lazy():
    import autoglm_serve.kernels.gemv
"""
    found = imports_of(source, "autoglm_serve.engine.runner")
    assert {"autoglm_serve.engine.core", "autoglm_serve.engine.request",
            "autoglm_serve.multimodal.inputs", "autoglm_serve.kernels.gemv"} <= found
    assert "os" not in found
    # in a package's __init__, `.` is the package itself
    assert "autoglm_serve.engine.core" in imports_of("from .core import X",
                                                     "autoglm_serve.engine", is_package=True)


def test_graph_sees_known_edges():
    graph = part_graph()
    assert "models" in graph["engine"]  # the engine builds and runs models
    assert "engine" in graph["server"]  # the server drives the engine
    # a function-level import: the engine core imports the kernels inside __init__, on CUDA
    assert any("engine.core.engine_core -> autoglm_serve.kernels" in e
               for e in graph["engine"]["kernels"])


def test_no_cycle_between_subpackages():
    graph = part_graph()
    cycles = find_cycles({part: set(targets) for part, targets in graph.items()})
    lines = []
    for cycle in cycles:
        lines.append(" -> ".join(cycle))
        for a, b in zip(cycle, cycle[1:]):
            lines += [f"  {a} -> {b}:"] + [f"    {edge}" for edge in graph[a][b]]
    assert not cycles, "import cycles between subpackages:\n" + "\n".join(lines)
