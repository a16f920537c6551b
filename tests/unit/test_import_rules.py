"""The import boundaries (docs/architecture.md, "Who may import whom"), read from the source:
every import of every module of the distribution (lazy imports inside functions and TYPE_CHECKING blocks included).

    source/, sink/  ->  checkpoints/  ->  client (remoting, grpc)  ->  codec / model / errors
    broker/         ->  codec / model / errors   (plus the gRPC servicer for its proxy port)
    cli, datasource ->  anything above

and no module is part of an import cycle. A cycle held apart by an import inside a function
still is one: the modules cannot be read, tested or moved one without the other, and which
import runs first decides whether the program starts. TYPE_CHECKING imports count too (a cycle
of types is a cycle of knowledge, and the rule costs nothing while there is none).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator, Mapping

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
#: the folders of the distribution and the package each one installs as (setup.cfg package_dir)
PACKAGES = {"rocketmq_spark": "rocketmq_spark", "source": "rocketmq_spark.source", "sink": "rocketmq_spark.sink",
            "checkpoints": "rocketmq_spark.checkpoints"}
SPARK_SIDE = ("rocketmq_spark.source", "rocketmq_spark.sink", "rocketmq_spark.checkpoints")
#: protocol-level modules the Spark side must reach only through the client contract
WIRE = ("rocketmq_spark.remoting", "rocketmq_spark.proto", "rocketmq_spark.client.connection",
        "rocketmq_spark.client.remoting", "rocketmq_spark.client.routes", "rocketmq_spark.client.grpc_client", "grpc",
        "google.protobuf",
        # the same transports as the client package re-exports them
        "rocketmq_spark.client.RemotingClient", "rocketmq_spark.client.GrpcClient",
        "rocketmq_spark.client.RemotingConnection")
PROTOCOL = ("rocketmq_spark.codec", "rocketmq_spark.client", "rocketmq_spark.remoting", "rocketmq_spark.proto")
#: the only modules that may use the generated protobuf code (beyond rocketmq_spark.proto itself)
GENERATED_USERS = ("rocketmq_spark.client.grpc_client", "rocketmq_spark.broker.grpc_service")


def _modules() -> Iterator[tuple[str, str]]:
    """(module name, path) of every hand-written module of the distribution."""
    for folder, package in PACKAGES.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "_gen")]
            for name in filenames:
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), base)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                yield ".".join([package, *rel]), os.path.join(dirpath, name)


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` names, relative ones resolved in ``package``."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _imports(module: str, path: str) -> Iterator[tuple[str, int]]:
    """Absolute names of everything ``module`` imports, with the line."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            yield target, node.lineno
            for alias in node.names:  # ``from . import x`` names a module too
                yield f"{target}.{alias.name}", node.lineno


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


MODULES = sorted(_modules())


def _violations(importers: tuple[str, ...], forbidden: tuple[str, ...], *, exact: bool = False) -> list[str]:
    """Imports of ``forbidden`` modules by ``importers`` (packages with their modules, or with
    ``exact`` these modules alone)."""
    out = []
    for module, path in MODULES:
        if not (module in importers if exact else _under(module, importers)):
            continue
        for target, line in _imports(module, path):
            if _under(target, forbidden) and not _under(target, (module,)):
                out.append(f"{os.path.relpath(path, ROOT)}:{line} imports {target}")
    return sorted(set(out))


def test_the_tree_is_read() -> None:
    names = {m for m, _ in MODULES}
    assert {"rocketmq_spark.broker.broker", "rocketmq_spark.source.reader", "rocketmq_spark.sink.writer",
            "rocketmq_spark.checkpoints.committer", "rocketmq_spark.codec.record"} <= names


def test_the_broker_never_imports_the_spark_side_or_the_clients() -> None:
    assert _violations(("rocketmq_spark.broker",),
                       ("pyspark", *SPARK_SIDE, "rocketmq_spark.client", "rocketmq_spark.datasource",
                        "rocketmq_spark.cli")) == []


def test_the_spark_side_never_imports_the_broker_or_the_wire() -> None:
    assert _violations(SPARK_SIDE, ("rocketmq_spark.broker", *WIRE)) == []


def test_protocol_code_never_imports_pyspark_or_the_layers_above() -> None:
    assert _violations(PROTOCOL, ("pyspark", *SPARK_SIDE, "rocketmq_spark.broker", "rocketmq_spark.datasource",
                                  "rocketmq_spark.cli")) == []


def test_the_codec_imports_no_transport() -> None:
    assert _violations(("rocketmq_spark.codec",), ("rocketmq_spark.client", "rocketmq_spark.remoting",
                                                   "rocketmq_spark.proto", "grpc", "socket", "asyncio")) == []


@pytest.mark.parametrize("generated", ["rocketmq_spark.proto", "grpc"])
def test_only_the_grpc_transport_and_servicer_use_generated_code(generated: str) -> None:
    everyone_else = tuple(m for m, _ in MODULES
                          if not _under(m, ("rocketmq_spark.proto",)) and m not in GENERATED_USERS)
    assert _violations(everyone_else, (generated,), exact=True) == []


def _module_imports(module: str, path: str, known: set[str]) -> Iterator[tuple[str, int]]:
    """The modules of ``known`` that ``module`` imports, with the line: ``from p import x`` imports
    module ``p.x`` when there is one (not ``p``'s ``__init__``, which Python does not wait for
    then), else ``p``. A module that imports by computed name (``importlib.import_module``)
    imports every module of ``known`` a string of it names (the lazy-name tables)."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    by_name = any(isinstance(n, ast.Attribute) and n.attr == "import_module"
                  or isinstance(n, ast.Name) and n.id == "import_module" for n in ast.walk(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            for alias in node.names:
                name = f"{target}.{alias.name}"
                if name in known:
                    yield name, node.lineno
                elif target in known:
                    yield target, node.lineno
        elif by_name and isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in known:
                yield node.value, node.lineno


def _import_graph() -> dict[str, dict[str, int]]:
    """module -> {module of the distribution it imports: the first line that does}."""
    known = {m for m, _ in MODULES}
    graph: dict[str, dict[str, int]] = {}
    for module, path in MODULES:
        edges = graph.setdefault(module, {})
        for target, line in sorted(_module_imports(module, path, known), key=lambda e: e[1]):
            if target != module:
                edges.setdefault(target, line)
    return graph


def _circles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # the package has fewer than 200 modules: recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _cycle_text(graph: Mapping[str, Mapping[str, int]], group: list[str], files: Mapping[str, str]) -> str:
    """One shortest cycle through the group's first module, each import with its file (from
    ``files``) and line, then the rest of the group."""
    start, members = group[0], set(group)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier and start not in came:  # breadth first, back to start
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w in members and w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    hops = [start]
    while len(hops) == 1 or hops[-1] != start:
        hops.append(came[hops[-1]])
    hops.reverse()
    text = hops[0] + "".join(f" -> {b} ({files[a]}:{graph[a][b]})"
                             for a, b in zip(hops, hops[1:]))
    rest = sorted(members - set(hops))
    return text + (f"; in the same circle: {', '.join(rest)}" if rest else "")


def test_no_module_of_the_distribution_is_in_an_import_cycle() -> None:
    graph = _import_graph()
    files = {m: os.path.relpath(path, ROOT) for m, path in MODULES}
    cycles = [_cycle_text(graph, group, files) for group in _circles(graph)]
    assert not cycles, "import cycles (imports inside functions count):\n  " + "\n  ".join(cycles)


def test_the_cycle_check_finds_a_cycle_and_names_it() -> None:
    graph = {"a": {"b": 3}, "b": {"c": 5, "e": 2}, "c": {"a": 7, "d": 1}, "d": {}, "e": {"b": 4}}
    assert _circles(graph) == [["a", "b", "c", "e"]]
    files = {m: f"{m}.py" for m in graph}
    assert _cycle_text(graph, ["a", "b", "c", "e"], files) == ("a -> b (a.py:3) -> c (b.py:5) -> a (c.py:7); "
                                                               "in the same circle: e")
    assert _circles({"a": {"b": 1}, "b": {}}) == []
