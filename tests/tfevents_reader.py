#!/usr/bin/env python3
"""Reads a TensorBoard event file without TensorFlow: checks each TFRecord's two masked CRC-32Cs
and decodes the Event protos by the protobuf wire format, printing one JSON object per event:
{"wall_time": ..., "step": ..., "file_version": ..., "values": {tag: simple_value}}.
Written from the formats' descriptions, apart from Stoker's C++ writer, to check it.
Exit 1 on a bad CRC or a truncated record."""
import json
import struct
import sys


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf: bytes, pos: int):
    result, shift = 0, 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(buf: bytes):
    """(field number, wire type, value) of a message's fields, in order."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def event(data: bytes) -> dict:
    out = {"wall_time": 0.0, "step": 0, "file_version": "", "values": {}}
    for number, wire, value in fields(data):
        if number == 1 and wire == 1:
            out["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2 and wire == 0:
            out["step"] = value
        elif number == 3 and wire == 2:
            out["file_version"] = value.decode()
        elif number == 5 and wire == 2:
            for n, w, v in fields(value):  # Summary.value
                if n != 1 or w != 2:
                    continue
                tag, simple = "", None
                for n2, w2, v2 in fields(v):
                    if n2 == 1 and w2 == 2:
                        tag = v2.decode()
                    elif n2 == 2 and w2 == 5:
                        simple = struct.unpack("<f", v2)[0]
                out["values"][tag] = simple
    return out


def main(path: str) -> int:
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            print(f"truncated record header at byte {pos}", file=sys.stderr)
            return 1
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if masked(header) != header_crc:
            print(f"bad length CRC at byte {pos}", file=sys.stderr)
            return 1
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or pos + 16 + length > len(data):
            print(f"truncated record at byte {pos}", file=sys.stderr)
            return 1
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if masked(body) != body_crc:
            print(f"bad data CRC at byte {pos}", file=sys.stderr)
            return 1
        print(json.dumps(event(body), sort_keys=True))
        pos += 16 + length
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
