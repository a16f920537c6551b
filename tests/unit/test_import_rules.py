"""The import boundaries (docs/architecture.md, "Who may import whom"), read from the source:
every import of every module of the distribution (lazy imports inside functions and TYPE_CHECKING blocks included).

    source/, sink/  ->  checkpoints/  ->  client (remoting, grpc)  ->  codec / model / errors
    broker/         ->  codec / model / errors   (plus the gRPC servicer for its proxy port)
    cli, datasource ->  anything above
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
#: the folders of the distribution and the package each one installs as (setup.cfg package_dir)
PACKAGES = {"rocketmq_spark": "rocketmq_spark", "source": "rocketmq_spark.source", "sink": "rocketmq_spark.sink",
            "checkpoints": "rocketmq_spark.checkpoints"}
SPARK_SIDE = ("rocketmq_spark.source", "rocketmq_spark.sink", "rocketmq_spark.checkpoints")
#: protocol-level modules the Spark side must reach only through the client contract
WIRE = ("rocketmq_spark.remoting", "rocketmq_spark.proto", "rocketmq_spark.client.connection",
        "rocketmq_spark.client.remoting", "rocketmq_spark.client.grpc_client", "grpc", "google.protobuf",
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
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
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
