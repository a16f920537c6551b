"""The reader's row schema: as Spark DDL and as the Arrow schema the decoders give (string,
int32, timestamp[us, tz=UTC], list<string>, map<string,string>, all nullable). Apart from
:mod:`.arrow` so that what plans a read (the driver's processes) does not load the decoders
and pyarrow.compute with it."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["ARROW_SCHEMA", "RETRY_COLUMNS", "RETRY_FIELDS", "RETRY_SCHEMA", "RETRY_SCHEMA_DDL", "SCHEMA_DDL",
           "TIMESTAMP"]

SCHEMA_DDL = (
    "topic STRING, broker STRING, queueId INT, queueOffset BIGINT, messageId STRING, tag STRING, "
    "keys ARRAY<STRING>, body BINARY, properties MAP<STRING,STRING>, bornTimestamp TIMESTAMP, "
    "storeTimestamp TIMESTAMP, bornHost STRING, storeHost STRING"
)

#: with includeRetryTopic the rows also say where a message given back came from: retryTopic (its
#: RETRY_TOPIC property: the topic it was first read from; null for the topics' own messages) and
#: reconsumeTimes (how many times it was given back: 0 for the topics' own messages)
RETRY_SCHEMA_DDL = SCHEMA_DDL + ", retryTopic STRING, reconsumeTimes INT"
RETRY_FIELDS = (pa.field("retryTopic", pa.string()), pa.field("reconsumeTimes", pa.int32()))
#: their names: the decoders give them when ``columns`` names them (see :func:`.arrow.decode_to_batch`)
RETRY_COLUMNS = tuple(f.name for f in RETRY_FIELDS)

TIMESTAMP = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("broker", pa.string()),
    pa.field("queueId", pa.int32()),
    pa.field("queueOffset", pa.int64()),
    pa.field("messageId", pa.string()),
    pa.field("tag", pa.string()),
    pa.field("keys", pa.list_(pa.field("element", pa.string()))),
    pa.field("body", pa.binary()),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("bornTimestamp", TIMESTAMP),
    pa.field("storeTimestamp", TIMESTAMP),
    pa.field("bornHost", pa.string()),
    pa.field("storeHost", pa.string()),
])
RETRY_SCHEMA = pa.schema([*ARROW_SCHEMA, *RETRY_FIELDS])
