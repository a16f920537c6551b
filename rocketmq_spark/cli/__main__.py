"""python -m rocketmq_spark.cli: the command line."""

import sys

from . import main

sys.exit(main())
