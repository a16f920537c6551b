"""mypy over every package of the distribution, as it is installed (run by .ci/run).

source/, sink/ and checkpoints/ are the packages rocketmq_spark.source, .sink and .checkpoints
(setup.cfg's package_dir), and rocketmq_spark/_pyspark_rocketmq is the top-level pyspark_rocketmq.
mypy maps module names from folders, and an editable install hides that mapping behind an
import hook, so this lays the installed shape out as symlinks in a temporary folder, runs mypy
there (with setup.cfg's [mypy] settings) and reports every path as the repository's own.

    python tests/typecheck.py        # exit status is mypy's
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: folder in the repository -> its place in the installed tree (setup.cfg package_dir)
MAPPED = {"source": "rocketmq_spark/source", "sink": "rocketmq_spark/sink",
          "checkpoints": "rocketmq_spark/checkpoints", "rocketmq_spark/_pyspark_rocketmq": "pyspark_rocketmq"}


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="typecheck-") as tmp:
        tree = Path(tmp)
        (tree / "rocketmq_spark").mkdir()
        for entry in (ROOT / "rocketmq_spark").iterdir():
            if entry.name not in ("_pyspark_rocketmq", "__pycache__"):
                (tree / "rocketmq_spark" / entry.name).symlink_to(entry)
        for repo_dir, installed in MAPPED.items():
            (tree / installed).symlink_to(ROOT / repo_dir)
        run = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "setup.cfg"), "--cache-dir",
             str(tree / ".mypy_cache"), "-p", "rocketmq_spark", "-p", "pyspark_rocketmq"],
            cwd=tree, capture_output=True, text=True)
    back = sorted(MAPPED.items(), key=lambda kv: -len(kv[1]))
    for line in (run.stdout + run.stderr).splitlines():
        for repo_dir, installed in back:
            if line.startswith(installed + "/"):
                line = repo_dir + line[len(installed):]
                break
        print(line)
    return run.returncode


if __name__ == "__main__":
    os.chdir(ROOT)
    raise SystemExit(main())
