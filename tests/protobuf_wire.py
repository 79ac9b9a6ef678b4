"""Protobuf wire-format pieces for tests that build bodies byte by byte (OTLP spans with
unusual encodings, Prometheus remote-write requests for the PromQL oracle)."""

from __future__ import annotations


def varint(value: int) -> bytes:
    """A base-128 varint; negative values as their 64-bit two's complement, as protobuf does."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload
