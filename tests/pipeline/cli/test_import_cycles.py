"""No import cycles among amdflash's modules, and the layers only call downward: every import
goes from a room to one on the same floor or a lower one (docs/architecture.md draws them).

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
        self.lines: dict[tuple[str, str], int] = {}   # (importer, imported): the first line saying so
        self._folders: set[Path] = set()               # each package's folder, found once

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
            self._folders.add(path.parent.resolve())
            for folder in _package_dirs(name):
                for child in sorted(folder.iterdir()):
                    if child.suffix == ".py" and child.name != "__init__.py":
                        self.is_module(f"{name}.{child.stem}")
                    elif (child / "__init__.py").is_file() and child.resolve() not in self._folders:
                        # (pipeline/amdflash/ is the root package, installed as `amdflash`, not a
                        # subpackage of amdflash.pipeline)
                        self.is_module(f"{name}.{child.name}")

    def build(self) -> Graph:
        assert self.is_module(ROOT), "amdflash is not installed"
        done: set[str] = set()
        while len(done) < len(self.files):
            for name in sorted(set(self.files) - done):
                done.add(name)
                self.edges[name] = set()
                for target, line in self._targets(name):
                    self.edges[name].add(target)
                    self.lines[name, target] = min(line, self.lines.get((name, target), line))
        return self

    def where(self, importer: str, imported: str) -> str:
        """file:line of the import, as a reader finds it from the project's root."""
        path = self.files[importer]
        shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
        return f"{shown}:{self.lines[importer, imported]}"

    def _targets(self, name: str) -> Iterator[tuple[str, int]]:
        tree = ast.parse(self.files[name].read_text(), str(self.files[name]))
        package = name if name in self.packages else name.rpartition(".")[0]
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self._deepest(alias.name)
                    if target:
                        yield target, node.lineno
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
                    yield target, node.lineno

    def _deepest(self, dotted: str) -> str | None:
        # Outermost first: a package must be known before its submodules can be.
        parts = dotted.split(".")
        found = None
        for n in range(1, len(parts) + 1):
            candidate = ".".join(parts[:n])
            if not self.is_module(candidate):
                break
            found = candidate
        return found


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


# The floors of the house, top to bottom (docs/architecture.md): a module may import its own
# room, or a room on the same floor or a lower one. A module is in the room with the longest
# name that prefixes its own.
FLOORS: dict[str, int] = {
    "amdflash.__main__": 8,             # the ways in: `python -m amdflash`,
    "amdflash.pipeline.launch": 8,      # the console script,
    "amdflash.pipeline.cli.__main__": 8,  # `python -m amdflash.pipeline.cli`
    "amdflash.pipeline.cli": 7,         # the command line: parsers and output
    "amdflash.pipeline.api": 7,         # the Python API: the other front door
    "amdflash.pipeline.fleet.serve": 7,  # the line view: a front door in a browser, as the CLI is on a terminal
    "amdflash": 7,                      # the package's face: `amdflash.api`, `__version__`, its data files
    "amdflash.pipeline.commands": 6,    # plain functions with typed results
    "amdflash.pipeline.engine": 5,      # runner, jobs, the stage graph, events, progress
    "amdflash.pipeline.fleet": 5,       # a line of hosts: labgrid, jobs on hosts, push, follow
    "amdflash.pipeline": 4,             # errors, config, logsetup: the pipeline's common ground
    "amdflash.store": 3,                # the audit trail
    "amdflash.stages": 2,               # one module per stage, and the one place that opens a board
    "amdflash.stages.sim": 2,           # the emulated board: its own room (see EMULATOR_DOORS)
    "amdflash.stages.drivers": 1,       # ROM_SW, aperture, PSP; the SPI NOR command set and chips
    "amdflash.stages.transport": 0,     # BAR5 access: usb, pci, amdgpu, discovery, locks
    # Pure functions of bytes and constants, which every floor may use (the amdgpu transport reads
    # the part number out of the VBIOS the kernel exposes as a PCI ROM file, with image.atom):
    "amdflash.stages.image": 0,         # ATOM, IFWI, partitions
    "amdflash.stages.drivers.flash.geometry": 0,   # the flash's size, sector, unit and page
}

# The modules that hand the emulated board to the rest, and why each may. Nothing else imports
# amdflash.stages.sim: a driver or a transport never knows it is talking to the emulator.
EMULATOR_DOORS: dict[str, str] = {
    "amdflash.stages.open_transport": "the one place that opens a board: sim:PATH",
    "amdflash.pipeline.cli.sim": "the `sim` commands: create, inspect and calibrate emulated boards",
    "amdflash.pipeline.commands.demo": "`demo`: a recovery on an emulated board it makes",
    "amdflash.store.replay": "`replay`: the recorded writes re-applied to an emulated board",
    # A hardware report is a real board measured against the emulator's model of it: the one
    # validator of what `sim create --from-report` and an ordinary run's --hardware-report accept
    # (report_model.check, calibration.loads) and the facts it confirms or contradicts.
    "amdflash.pipeline.commands.hardware_report": "`hardware-report`: a board's facts against the emulator's model",
    "amdflash.pipeline.engine.board_report": "--hardware-report: a report checked by the model's one validator",
}


def room(module: str) -> str:
    """The room `module` lives in: the longest name in FLOORS that is it or prefixes it."""
    rooms = [r for r in FLOORS if module == r or module.startswith(r + ".")]
    assert rooms, f"{module} is in no room: give its folder a floor in FLOORS"
    return max(rooms, key=len)


def upward_edges(graph: Graph) -> list[str]:
    """Every import from a room to one on a higher floor, each as `file:line: importer (floor n)
    imports imported (floor m)`."""
    found = []
    for importer, targets in sorted(graph.edges.items()):
        for imported in sorted(targets):
            low, high = room(importer), room(imported)
            if FLOORS[high] > FLOORS[low]:
                found.append(f"{graph.where(importer, imported)}: {importer} (floor {FLOORS[low]}) imports "
                             f"{imported} (floor {FLOORS[high]})")
    return found


def emulator_imports(graph: Graph, under: str = "") -> list[str]:
    """Imports of the emulator by a module outside it that is not one of its doors."""
    sim = "amdflash.stages.sim"
    return [f"{graph.where(importer, imported)}: {importer} imports {imported}"
            for importer, targets in sorted(graph.edges.items()) if importer.startswith(under)
            and room(importer) != sim and importer not in EMULATOR_DOORS
            for imported in sorted(targets) if room(imported) == sim]


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


def test_every_module_has_a_floor(graph: Graph) -> None:
    for module in graph.files:
        room(module)
    assert room("amdflash.pipeline.cli.main") == "amdflash.pipeline.cli"
    assert room("amdflash.pipeline.errors") == "amdflash.pipeline"
    assert room("amdflash.stages.drivers.flash.spinor") == "amdflash.stages.drivers"
    assert room("amdflash.__main__") == "amdflash.__main__"
    assert "amdflash.pipeline.amdflash" not in graph.files      # the root package, found once, as `amdflash`
    assert set(EMULATOR_DOORS) <= set(graph.files)


def test_every_import_goes_to_the_same_floor_or_down(graph: Graph) -> None:
    upward = upward_edges(graph)
    assert upward == [], f"{len(upward)} import(s) go up a floor (docs/architecture.md):\n" + "\n".join(upward)


def test_no_transport_imports_the_emulator(graph: Graph) -> None:
    found = emulator_imports(graph, "amdflash.stages.transport")
    assert found == [], "a transport imports the emulator; the one place that opens a board " \
                        "(stages/open_transport.py) hands it in:\n" + "\n".join(found)


def test_the_emulator_is_reached_only_through_its_doors(graph: Graph) -> None:
    found = emulator_imports(graph)
    assert found == [], "the emulator imported outside its doors (EMULATOR_DOORS):\n" + "\n".join(found)


def test_the_floor_check_names_an_upward_import_and_its_line() -> None:
    g = Graph()
    g.files = {"amdflash.stages.transport.usb": Path("usb.py"), "amdflash.store.writer": Path("writer.py"),
               "amdflash.stages.sim.board": Path("board.py")}
    g.edges = {"amdflash.stages.transport.usb": {"amdflash.store.writer", "amdflash.stages.sim.board"},
               "amdflash.store.writer": {"amdflash.stages.transport.usb"}, "amdflash.stages.sim.board": set()}
    g.lines = {("amdflash.stages.transport.usb", "amdflash.store.writer"): 12,
               ("amdflash.stages.transport.usb", "amdflash.stages.sim.board"): 30,
               ("amdflash.store.writer", "amdflash.stages.transport.usb"): 7}
    assert upward_edges(g) == [
        "usb.py:30: amdflash.stages.transport.usb (floor 0) imports amdflash.stages.sim.board (floor 2)",
        "usb.py:12: amdflash.stages.transport.usb (floor 0) imports amdflash.store.writer (floor 3)"]
    assert emulator_imports(g, "amdflash.stages.transport") == [
        "usb.py:30: amdflash.stages.transport.usb imports amdflash.stages.sim.board"]
