"""Run at start-up by every Python process of a test run (tests/conftest.py puts this folder on
PYTHONPATH, which Spark passes on to the Python processes it starts).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on the path of each
Python process it starts. Python compiles a module imported from a zip on every start (it writes
no bytecode back into a zip): ~0.5 s of CPU for pyspark's modules, in each process, and every
streaming query of a Python data source starts a new one (its source runner). Here those zips
move behind site-packages, where the same pyspark is installed with its bytecode cached: the same
code, loaded from the installation the zip came with. Nothing moves when that installation is not
on the path (a Spark distribution of its own)."""

import os
import sys


def _zips_behind_site_packages() -> None:
    lib = os.sep + os.path.join("pyspark", "python", "lib") + os.sep
    zips = [p for p in sys.path if p.endswith(".zip") and lib in p]
    if zips and all(z.split(lib)[0] in sys.path for z in zips):
        for z in zips:
            sys.path.remove(z)
            sys.path.append(z)


_zips_behind_site_packages()
