"""python -m rocketmq_spark: the command line."""

import sys

from .cli import main

sys.exit(main())
