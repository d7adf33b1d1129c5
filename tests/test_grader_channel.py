"""The checker's channel to the grader: typed records, decoded field by field, bounded, never blocking."""

import json
import os
import threading

from fuselab.grading.recheck import channel


def _line(**record):
    return json.dumps(record).encode()


def test_records_cross_as_the_dataclasses_they_were():
    receiver, write_fd = channel.Receiver.open()
    try:
        sender = channel.Sender(write_fd)
        sent = [channel.CellStart(0, "setup"), channel.CellEnd(0, "setup", value=2, stdout="hi", speed=[{"a": 1}]),
                channel.Poisoned(0, None, "a fault"), channel.Done()]
        for record in sent:
            sender.send(record)
        received = receiver.poll()
    finally:
        receiver.close()
        os.close(write_fd)
    assert received == sent and all(record.time > 0 for record in received)
    assert isinstance(received[1].value, float) and received[1].value == 2.0


def test_a_line_is_a_record_only_when_every_field_has_its_type():
    assert channel.decode(_line(kind="start", index=3, grade_id=None, time=1.5)) == channel.CellStart(3, None, 1.5)
    assert channel.decode(_line(kind="done")) == channel.Done()
    for bad in (b"not json", b"[1]", b'"x"', _line(index=0), _line(kind="exec", index=0),
                _line(kind="start", grade_id=None),                         # a field without a default missing
                _line(kind="start", index="0", grade_id=None),              # a number as text
                _line(kind="start", index=True, grade_id=None),             # a boolean is not a number
                _line(kind="end", index=0, grade_id=None, value=True),
                _line(kind="end", index=0, grade_id=None, time="soon"),
                _line(kind="end", index=0, grade_id=None, stdout=["a"]),
                _line(kind="poisoned", index=0, grade_id=None, why=None),
                b"[" * 100000):                                              # nesting past the parser's depth
        assert channel.decode(bad) is None, bad
    speed = channel.decode(_line(kind="end", index=0, grade_id="t", speed=[{"test": "x"}, "forged", 3]))
    assert speed.speed == [{"test": "x"}]


def test_a_record_past_the_line_limit_is_dropped_and_the_next_ones_still_read():
    receiver, write_fd = channel.Receiver.open()
    try:
        def write():  # more than a pipe holds: written while the receiver reads
            with open(write_fd, "wb", closefd=False) as pipe:
                pipe.write(_line(kind="done", padding="x" * (channel.LINE_LIMIT + 10)) + b"\n")
            channel.Sender(write_fd).send(channel.CellStart(1, "t"))
        writer = threading.Thread(target=write)
        writer.start()
        received = []
        while writer.is_alive() or not received:
            received += receiver.poll()
            writer.join(0.01)
        assert [(type(r), r.index) for r in received] == [(channel.CellStart, 1)]
    finally:
        receiver.close()
        os.close(write_fd)


def test_a_line_cut_short_is_never_read_and_polling_never_blocks():
    receiver, write_fd = channel.Receiver.open()
    try:
        assert receiver.poll() == []  # nothing written yet: returns at once
        os.write(write_fd, _line(kind="start", index=0, grade_id=None)[:-1])  # a writer killed mid-line
        os.close(write_fd)
        write_fd = None
        assert receiver.poll() == [] and receiver.poll() == []
    finally:
        receiver.close()
        if write_fd is not None:
            os.close(write_fd)
