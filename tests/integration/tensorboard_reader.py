#!/usr/bin/env python3
"""An independent reader of TensorBoard event files, written from the
published format (TensorFlow's record_writer.cc / record_reader.cc and
tensorboard/compat/proto/event.proto, summary.proto), not from kappa's C++.

  TFRecord  uint64 length (LE) | uint32 masked CRC-32C of the 8 length bytes
            | data | uint32 masked CRC-32C of the data
  mask      ((crc >> 15) | (crc << 17)) + 0xa282ead8, mod 2^32
  Event     wall_time = 1 (double), step = 2 (int64), file_version = 3,
            summary = 5; Summary.value = 1 (repeated);
            Value.tag = 1, Value.simple_value = 2 (float)

The Event is decoded with python3-protobuf from a descriptor built here.
A file that ends inside a record is read up to its last whole record, as
TensorBoard reads it; a CRC that does not match is an error.

Usage:
  tensorboard_reader.py --check RUN_DIR
      every metrics.jsonl record's scalars (nested keys joined by "/",
      booleans 0/1) equal, as float32, the event of its step; the first
      event is the file_version one; then a copy of the file cut inside its
      last record still reads, without that record.
  tensorboard_reader.py --dump FILE
Exit 0 on success, 1 on a mismatch (each printed), 2 on bad usage.
"""
import glob
import json
import os
import shutil
import struct
import sys
import tempfile

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def crc32c(data):
    """CRC-32C (Castagnoli, RFC 3720 12.1), bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    f = descriptor_pb2.FileDescriptorProto()
    f.name = "kappa_test_event.proto"
    f.package = "tensorflow"
    f.syntax = "proto3"
    T = descriptor_pb2.FieldDescriptorProto
    value = f.message_type.add(name="SummaryValue")
    value.field.add(name="tag", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=T.TYPE_FLOAT, label=T.LABEL_OPTIONAL)
    summary = f.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=T.TYPE_MESSAGE, label=T.LABEL_REPEATED,
                      type_name=".tensorflow.SummaryValue")
    event = f.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=T.TYPE_DOUBLE, label=T.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                    type_name=".tensorflow.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    descriptor = pool.FindMessageTypeByName("tensorflow.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def read_records(path):
    """(records, whole): the data of every whole record; whole is False when
    the file ends inside a record. Raises ValueError on a CRC mismatch."""
    with open(path, "rb") as f:
        data = f.read()
    records, at = [], 0
    while at < len(data):
        if len(data) - at < 12:
            return records, False
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if masked(crc32c(header)) != length_crc:
            raise ValueError(f"{path}: record at byte {at}: length CRC mismatch")
        if len(data) - at < 12 + length + 4:
            return records, False
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if masked(crc32c(body)) != body_crc:
            raise ValueError(f"{path}: record at byte {at}: data CRC mismatch")
        records.append(body)
        at += 16 + length
    return records, True


def events(path):
    Event = event_class()
    records, whole = read_records(path)
    out = []
    for body in records:
        event = Event()
        event.ParseFromString(body)
        out.append(event)
    return out, whole


def flatten(prefix, node, out):
    if isinstance(node, dict):
        for key, value in node.items():
            flatten(f"{prefix}/{key}" if prefix else key, value, out)
    elif isinstance(node, bool):
        out[prefix] = 1.0 if node else 0.0
    elif isinstance(node, (int, float)):
        out[prefix] = float(node)


def as_float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check(run_dir):
    problems = []
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if len(files) != 1:
        return [f"{run_dir}: expected one event file, found {len(files)}"]
    read, whole = events(files[0])
    if not whole:
        problems.append(f"{files[0]}: ends inside a record")
    if not read or read[0].file_version != "brain.Event:2":
        problems.append(f"{files[0]}: the first event is not file_version brain.Event:2")
    by_step = {}
    for event in read[1:]:
        if event.file_version:
            problems.append(f"step {event.step}: a second file_version event")
        by_step[event.step] = {v.tag: v.simple_value for v in event.summary.value}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        problems.append("metrics.jsonl is empty")
    for record in records:
        expected = {}
        flatten("", record, expected)
        step = record["step"]
        got = by_step.pop(step, None)
        if got is None:
            problems.append(f"step {step}: no event")
            continue
        if set(got) != set(expected):
            problems.append(f"step {step}: tags differ: only in events {sorted(set(got) - set(expected))}, "
                            f"only in metrics.jsonl {sorted(set(expected) - set(got))}")
        for tag in sorted(set(got) & set(expected)):
            want = as_float32(expected[tag])
            if not (got[tag] == want or (want != want and got[tag] != got[tag])):
                problems.append(f"step {step} {tag}: event {got[tag]!r}, metrics.jsonl {want!r}")
    if by_step:
        problems.append(f"events of steps not in metrics.jsonl: {sorted(by_step)}")
    # A crash inside the last record: the rest still reads.
    with tempfile.TemporaryDirectory() as tmp:
        cut = os.path.join(tmp, os.path.basename(files[0]))
        shutil.copy(files[0], cut)
        with open(files[0], "rb") as f:
            size = len(f.read())
        os.truncate(cut, size - 7)
        partial, whole = events(cut)
        if whole or len(partial) != len(read) - 1:
            problems.append(f"a file cut inside its last record read {len(partial)} events "
                            f"(whole={whole}), expected {len(read) - 1}")
    if not problems:
        print(f"tensorboard_reader: {len(records)} steps; "
              f"every scalar of metrics.jsonl is in {os.path.basename(files[0])}")
    return problems


def main(argv):
    if len(argv) == 3 and argv[1] == "--check":
        problems = check(argv[2])
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    if len(argv) == 3 and argv[1] == "--dump":
        read, whole = events(argv[2])
        for event in read:
            print(event.step, event.file_version or
                  {v.tag: v.simple_value for v in event.summary.value})
        print("whole" if whole else "ends inside a record")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
