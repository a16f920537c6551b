"""Run at start-up by every Python process of a test run (tests/conftest.py puts this folder on
PYTHONPATH, which Spark passes on to the Python processes it starts).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the path of each Python process it
starts. Python compiles a module imported from a zip on every start (it writes no bytecode back
into a zip): ~0.5 s of CPU for pyspark's modules, in each process, and every streaming query of
a Python data source starts a new one (its source runner). Here that zip moves behind
site-packages, where the same pyspark is installed with its bytecode cached: the same code,
loaded from the installation the zip came with. It stays where it was when another pyspark would
be found first. py4j's zip is left alone (small, and the installed py4j may be another version).
A ``sitecustomize`` this one shadows further on the path still runs."""

import importlib.machinery
import importlib.util
import os
import sys


def _zip_behind_site_packages() -> None:
    lib = os.sep + os.path.join("pyspark", "python", "lib") + os.sep
    zips = [p for p in sys.path if p.endswith(os.sep + "pyspark.zip") and lib in p]
    if len(zips) != 1:
        return
    (zipped,) = zips
    home = zipped.split(lib)[0]  # the site-packages the zip's pyspark is installed in
    if home not in sys.path:
        return
    at = sys.path.index(zipped)
    del sys.path[at]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", sys.path)
    if spec is None or not (spec.origin or "").startswith(home + os.sep):
        sys.path.insert(at, zipped)  # another pyspark would win: keep Spark's own order
        return
    sys.path.append(zipped)


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_zip_behind_site_packages()
_run_shadowed()
