"""rocketmq_spark.sink: the Spark writer (stream and batch), transactional commit."""

from .options import WriterOptions, check_columns
from .txlog import TxLog, Txn
from .writer import RocketMQBatchWriter, RocketMQStreamWriter, TaskReport

__all__ = ["RocketMQBatchWriter", "RocketMQStreamWriter", "TaskReport", "TxLog", "Txn", "WriterOptions",
           "check_columns"]
