"""Spark-facing code validates with the error tree, never with ``assert`` (gone under python -O)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPARK_FACING = [*sorted((ROOT / "source").glob("*.py")), *sorted((ROOT / "sink").glob("*.py")),
                *sorted((ROOT / "checkpoints").glob("*.py")), ROOT / "rocketmq_spark" / "datasource.py"]


def test_no_assert_statement_in_spark_facing_code() -> None:
    found = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in SPARK_FACING
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assert)]
    assert found == [], f"use an error of rocketmq_spark.errors instead of assert at {found}"
