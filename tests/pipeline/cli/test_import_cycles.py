"""No import cycles among amdflash's modules: the layers only call downward.

The graph is built from the installed package's source with `ast` (nothing is imported but
the packages themselves, to find where they live): every `import` statement counts, at
module level or inside a function, except those under `if TYPE_CHECKING:` (which never run).
A function-level import that closes a loop is still a loop in the design, only a hidden one.
"""
from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = "amdflash"


def _package_dirs(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _module_file(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
           (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (skips `if TYPE_CHECKING:` bodies)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


class Graph:
    def __init__(self) -> None:
        self.files: dict[str, Path] = {}
        self.packages: set[str] = set()
        self.edges: dict[str, set[str]] = {}

    def is_module(self, name: str) -> bool:
        if name in self.files:
            return True
        parent = name.rpartition(".")[0]
        if name != ROOT and parent not in self.packages:
            return False   # only a package has submodules (and find_spec would import the parent)
        try:
            found = _module_file(name)
        except (ImportError, ValueError):
            return False
        if found is None:
            return False
        self.add(name, found)
        return True

    def add(self, name: str, path: Path) -> None:
        if name in self.files:
            return
        self.files[name] = path
        if path.name == "__init__.py":
            self.packages.add(name)
            for folder in _package_dirs(name):
                for child in sorted(folder.iterdir()):
                    if child.suffix == ".py" and child.name != "__init__.py":
                        self.is_module(f"{name}.{child.stem}")
                    elif (child / "__init__.py").is_file():
                        self.is_module(f"{name}.{child.name}")

    def build(self) -> Graph:
        assert self.is_module(ROOT), "amdflash is not installed"
        done: set[str] = set()
        while len(done) < len(self.files):
            for name in sorted(set(self.files) - done):
                done.add(name)
                self.edges[name] = set(self._targets(name))
        return self

    def _targets(self, name: str) -> Iterator[str]:
        tree = ast.parse(self.files[name].read_text(), str(self.files[name]))
        package = name if name in self.packages else name.rpartition(".")[0]
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self._deepest(alias.name)
                    if target:
                        yield target
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                # `from package import name`: the submodule if there is one, else the package.
                target = self._deepest(f"{base}.{alias.name}") or self._deepest(base)
                if target:
                    yield target

    def _deepest(self, dotted: str) -> str | None:
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            candidate = ".".join(parts[:n])
            if self.is_module(candidate):
                return candidate
        return None


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    cycles.append(sorted(component))
    return cycles


@pytest.fixture(scope="module")
def graph() -> Graph:
    return Graph().build()


def test_the_graph_covers_every_layer(graph: Graph) -> None:
    for layer in ("amdflash.pipeline.cli.main", "amdflash.pipeline.engine.jobs", "amdflash.stages.erase",
                  "amdflash.stages.drivers.flash.spinor", "amdflash.stages.sim", "amdflash.store.writer",
                  "amdflash.pipeline.fleet"):
        assert layer in graph.files
    assert "amdflash.stages.erase" in graph.edges["amdflash.pipeline.engine.flash_graph"]
    assert len(graph.files) > 100


def test_no_import_cycles(graph: Graph) -> None:
    cycles = find_cycles(graph.edges)
    assert cycles == [], "import cycles:\n" + "\n".join(" ↔ ".join(c) for c in cycles)


def test_the_check_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert find_cycles(edges) == [["a", "b", "c"], ["e"]]


def test_function_level_imports_count_and_type_checking_ones_do_not() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n"
                     "def f():\n    import y\n")
    names = [a.name for node in _imports(tree) for a in node.names]
    assert sorted(names) == ["TYPE_CHECKING", "y"]
