"""The message record codec: the one layout of RocketMQ's stored and pulled messages, their
properties and sys flags, and batch send bodies. Pure functions over bytes: no sockets, no
pyspark, and nothing heavier than the standard library at import (numpy/pyarrow load with
the vectorised modules, :mod:`.arrow` and :mod:`.batch_kernels`).

    record.py         the record layout: scalar encode/decode, hosts, message ids, SysFlag
    properties.py     ``key\\x01value\\x02`` properties, system keys, tags and their hash
    batch.py          batch send bodies (BatchEntry, EncodedBatch)
    batch_kernels.py  the broker's vectorised batch path: batch entries -> stored records
    schema.py         the reader's row schema (Spark DDL and Arrow)
    arrow.py          the reader's vectorised decode: records -> Arrow columns of that schema
    tags.py           the tag filter: subscriptions, the broker's by hash, the reader's by string
"""

from .batch import BatchEntry, EncodedBatch, batch_entries, decode_batch, encode_batch
from .properties import (
    SYSTEM_PROPERTY_KEYS,
    PropertyKey,
    decode_properties,
    encode_properties,
    java_string_hash,
    join_properties,
    property_of,
)
from .record import (
    BLANK_MAGIC,
    HEAD,
    MAGIC_V1,
    MAGIC_V2,
    MAX_PROPERTIES_BYTES,
    MessageRecord,
    RecordParts,
    SysFlag,
    TransactionType,
    body_crc,
    body_span,
    decode_record,
    decode_records,
    encode_record,
    iter_records,
    offset_msg_id,
    offset_of_msg_id,
    pack_host,
    parse_offset_msg_id,
    properties_text,
    record_parts,
    record_size,
    split_host,
    split_record,
)
from .tags import subscribed_tags, tag_hash, tag_of

__all__ = [
    "BLANK_MAGIC",
    "HEAD",
    "MAGIC_V1",
    "MAGIC_V2",
    "MAX_PROPERTIES_BYTES",
    "SYSTEM_PROPERTY_KEYS",
    "BatchEntry",
    "EncodedBatch",
    "MessageRecord",
    "RecordParts",
    "PropertyKey",
    "SysFlag",
    "TransactionType",
    "batch_entries",
    "body_crc",
    "body_span",
    "decode_batch",
    "decode_properties",
    "decode_record",
    "decode_records",
    "encode_batch",
    "encode_properties",
    "encode_record",
    "iter_records",
    "java_string_hash",
    "join_properties",
    "offset_msg_id",
    "offset_of_msg_id",
    "pack_host",
    "parse_offset_msg_id",
    "properties_text",
    "record_parts",
    "record_size",
    "split_host",
    "split_record",
    "subscribed_tags",
    "tag_hash",
    "property_of",
    "tag_of",
]
