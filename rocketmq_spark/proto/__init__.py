"""RocketMQ 5 gRPC messages (``apache.rocketmq.v2``) for the gRPC transport and the
embedded broker's gRPC endpoint; nothing else imports this package.

``messaging.proto`` is the source; ``_gen/`` is generated from it by
``python -m rocketmq_spark.proto.generate`` and committed. Import the modules as
``from rocketmq_spark.proto import pb, pb_grpc`` (loaded on first use, so the
generator runs even when ``_gen/`` is missing).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["pb", "pb_grpc"]

_MODULES = {"pb": "._gen.messaging_pb2", "pb_grpc": "._gen.messaging_pb2_grpc"}


def __getattr__(name: str) -> Any:
    target = _MODULES.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(target, __name__)
    # kept in the package's namespace, so later lookups skip this function; threads racing the
    # first lookup get the same module from the (locked) import and store it twice
    globals()[name] = module
    return module
