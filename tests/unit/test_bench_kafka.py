"""The benchmarks' Kafka: a cluster id the storage tool cannot take for an option."""

from __future__ import annotations

import uuid

import pytest

import benchmarks._kafka as kafka


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8: the first six bits are 62, "-" in URL-safe base64 (one draw in 64 starts so)
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x10" + bytes(15))])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(draws))
    got = kafka._cluster_id()
    assert got == "EAAAAAAAAAAAAAAAAAAAAA" and not got.startswith("-")
