"""Layout contract (docs/architecture.md: "Layout"), and what a fresh interpreter loads (the
import boundaries as read from the source are test_import_rules.py's; docs/architecture.md:
"Who may import whom")."""

from __future__ import annotations

import os
import subprocess
import sys

import rocketmq_spark

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_role_folders_are_subpackages_through_package_dir() -> None:
    import rocketmq_spark.checkpoints
    import rocketmq_spark.sink
    import rocketmq_spark.source

    for mod, folder in ((rocketmq_spark.source, "source"), (rocketmq_spark.sink, "sink"),
                        (rocketmq_spark.checkpoints, "checkpoints")):
        assert mod.__file__ is not None
        assert os.path.dirname(os.path.abspath(mod.__file__)) == os.path.join(ROOT, folder)


def _modules_after(imports: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``imports``."""
    code = f"import sys\n{imports}\nprint('\\n'.join(sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_no_stray_top_level_role_modules_get_imported() -> None:
    loaded = _modules_after("import rocketmq_spark.source, rocketmq_spark.sink, rocketmq_spark.checkpoints")
    assert not loaded & {"source", "sink", "checkpoints"}


def test_public_names_are_exported() -> None:
    for name in rocketmq_spark.__all__:
        assert getattr(rocketmq_spark, name) is not None, name
    from rocketmq_spark import broker, client, errors, remoting

    for mod in (broker, client, remoting, errors):
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.{name}"


def test_broker_and_protocol_code_never_import_pyspark() -> None:
    loaded = _modules_after("from rocketmq_spark.broker import EmbeddedBroker\n"
                            "from rocketmq_spark.client import RemotingClient\n"
                            "import rocketmq_spark.remoting, rocketmq_spark.cli")
    assert not [m for m in loaded if m.startswith(("pyspark", "rocketmq_spark.source", "rocketmq_spark.sink",
                                                   "rocketmq_spark.checkpoints"))]


def test_the_data_source_modules_do_not_import_pandas() -> None:
    # Spark starts fresh Python processes to plan reads, create writers and commit: each one
    # imports these modules, and pandas alone would cost it ~0.4 s of CPU and ~40 MB
    loaded = _modules_after("import rocketmq_spark.datasource, rocketmq_spark.source, rocketmq_spark.sink\n"
                            "import rocketmq_spark.codec.arrow, rocketmq_spark.sink.encode, "
                            "rocketmq_spark.checkpoints")
    assert "rocketmq_spark.sink.encode" in loaded and "pandas" not in loaded


def test_planning_a_read_loads_no_decoder() -> None:
    # the driver's planning processes (one per query, started anew) load the data source and its
    # readers but not the decoders and pyarrow.compute (~0.05 s of each process's start); the
    # executors load them with read_range
    loaded = _modules_after("import rocketmq_spark.datasource\nfrom rocketmq_spark.source import SCHEMA_DDL")
    assert "rocketmq_spark.source.reader" in loaded
    assert not loaded & {"pyarrow.compute", "rocketmq_spark.codec.arrow", "rocketmq_spark.source.pull_loop"}
    loaded = _modules_after("from rocketmq_spark.source import read_range")
    assert {"rocketmq_spark.source.pull_loop", "rocketmq_spark.codec.arrow"} <= loaded


def test_top_level_layout_is_the_agreed_one() -> None:
    required = {"setup.cfg", "pyproject.toml", "rocketmq_spark", "source", "sink", "checkpoints", "tests",
                "benchmarks", "README.md", ".ci"}
    present = set(os.listdir(ROOT))
    assert required <= present
    with open(os.path.join(ROOT, "pyproject.toml")) as fh:
        text = fh.read()
    assert "[build-system]" in text and "[project]" not in text
    assert os.path.exists(os.path.join(ROOT, "rocketmq_spark", "py.typed"))


def test_generated_grpc_modules_match_the_proto() -> None:
    """rocketmq_spark/proto/_gen is what `python -m rocketmq_spark.proto.generate` writes."""
    from rocketmq_spark.proto import generate

    assert generate.main(["--check"]) == 0


def test_grpc_messages_live_in_a_private_pool() -> None:
    """The official SDK registers apache.rocketmq.v2 in protobuf's default pool: ours must not."""
    from google.protobuf import descriptor_pool

    from rocketmq_spark.proto import pb

    assert pb.Message.DESCRIPTOR.full_name == "apache.rocketmq.v2.Message"
    try:
        descriptor_pool.Default().FindMessageTypeByName("apache.rocketmq.v2.Message")
    except KeyError:
        pass
    else:  # the SDK may be imported by another test in this process; then it is its copy
        assert "rocketmq.grpc_protocol" in sys.modules


def test_every_package_of_the_tree_is_in_the_distribution() -> None:
    # setup.cfg lists packages by name: a new one left out installs in editable mode (the tests)
    # and is missing from the wheel users install
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    listed = set(cfg["options"]["packages"].split())
    roots = {"rocketmq_spark": "rocketmq_spark", "source": "rocketmq_spark.source", "sink": "rocketmq_spark.sink",
             "checkpoints": "rocketmq_spark.checkpoints"}
    found = set()
    for folder, package in roots.items():
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and d != "_pyspark_rocketmq"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                found.add(package if rel == "." else f"{package}.{rel.replace(os.sep, '.')}")
    assert found - listed == set(), "packages missing from setup.cfg [options] packages"
