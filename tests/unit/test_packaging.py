"""Layout contract (DESIGN.md section 3) and import boundaries (section 9)."""

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


def test_no_stray_top_level_role_modules_get_imported() -> None:
    code = (
        "import sys, rocketmq_spark.source, rocketmq_spark.sink, rocketmq_spark.checkpoints\n"
        "stray = [m for m in ('source', 'sink', 'checkpoints') if m in sys.modules]\n"
        "print(','.join(stray))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_names_are_exported() -> None:
    for name in rocketmq_spark.__all__:
        assert getattr(rocketmq_spark, name) is not None, name
    from rocketmq_spark import broker, client, errors, remoting

    for mod in (broker, client, remoting, errors):
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.{name}"


def test_broker_and_protocol_code_never_import_pyspark() -> None:
    code = (
        "import sys\n"
        "from rocketmq_spark.broker import EmbeddedBroker\n"
        "from rocketmq_spark.client import RemotingClient\n"
        "import rocketmq_spark.remoting, rocketmq_spark.cli\n"
        "bad = [m for m in sys.modules if m.startswith(('pyspark', 'rocketmq_spark.source',"
        " 'rocketmq_spark.sink', 'rocketmq_spark.checkpoints'))]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_top_level_layout_is_the_agreed_one() -> None:
    required = {"setup.cfg", "pyproject.toml", "rocketmq_spark", "source", "sink", "checkpoints", "tests",
                "benchmarks", "README.md", ".ci"}
    present = set(os.listdir(ROOT))
    assert required <= present
    with open(os.path.join(ROOT, "pyproject.toml")) as fh:
        text = fh.read()
    assert "[build-system]" in text and "[project]" not in text
    assert os.path.exists(os.path.join(ROOT, "rocketmq_spark", "py.typed"))
