"""hvdrun's output reader on its own (no MPI): bounded memory, order kept, status lines found."""

import collections
import io
import os
import queue
import random
import threading

import pytest

from hvdlite.runner import job, protocol

pytestmark = pytest.mark.timeout(60)

TOKEN = "feedc0de"
MARKER = protocol.marker(TOKEN).encode()


def _pieces_of(buffer, data, sizes):
    """Feed *data* in chunks of the given sizes; the pieces, and the most it ever held."""
    pieces, most, at = [], 0, 0
    for size in sizes:
        pieces += buffer.feed(data[at : at + size])
        most = max(most, len(buffer.pending))
        at += size
    return pieces, most


def test_line_buffer_keeps_order_and_bound():
    rng = random.Random(7)
    status = protocol.encode({"event": "start", "rank": 0, "host": "h", "pid": 1, "size": 1}, TOKEN)
    data = (
        b"x" * 1000
        + b"\r"
        + b"y" * 500
        + b"\n"
        + b"line\n"
        + b"z" * 777
        + status
        + b"@@hvdlite-task-"
        + b"q" * 300
        + b"\n"
        + b"no newline at the end"
    )
    for _ in range(50):
        buffer = job._LineBuffer(MARKER, limit=len(status) + 10)
        sizes = [rng.randint(1, 200) for _ in range(len(data))]
        pieces, most = _pieces_of(buffer, data, sizes)
        assert most <= buffer.limit
        assert b"".join(piece for piece, _ in pieces) + buffer.pending == data
        whole = [piece for piece, is_line in pieces if is_line]
        # The status line comes out whole (behind the end of the long line it ended).
        assert any(piece.endswith(status) for piece in whole)
        assert all(piece.endswith(b"\n") for piece in whole)


def test_reader_passes_megabytes_without_newline_in_bounded_memory():
    data = bytes(range(256)).replace(b"\n", b"") * 20000  # ~5 MB, no newline
    read_fd, write_fd = os.pipe()
    sink, events = io.BytesIO(), queue.Queue()
    tail = collections.deque(maxlen=10)
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        reader = job._Reader("stdout", pipe, sink, events, tail, TOKEN, 2)
        feed, most = reader.buffer.feed, [0]

        def watched_feed(chunk):
            pieces = feed(chunk)
            most[0] = max(most[0], len(reader.buffer.pending))
            return pieces

        reader.buffer.feed = watched_feed
        reader.start()

        def write():
            with os.fdopen(write_fd, "wb") as out:
                for at in range(0, len(data), 1 << 20):
                    out.write(data[at : at + (1 << 20)])

        writer = threading.Thread(target=write)
        writer.start()
        writer.join(timeout=60)
        reader.join(timeout=60)
    assert not reader.is_alive()
    assert most[0] <= job.MAX_PENDING_BYTES
    assert sink.getvalue() == data
    assert events.get_nowait() == ("eof", None)
    assert all(len(text) <= protocol.MAX_LINE_CHARS for _stream, text in tail)


@pytest.mark.parametrize(
    "line",
    [
        b'@@hvdlite-task@@ {"event":"exit","rank":0,"code":3}\n',
        MARKER + b' {"event":"exit","rank":5,"host":"h","code":3}\n',
        MARKER + b" {not json\n",
    ],
)
def test_reader_passes_forged_status_lines_through(line):
    read_fd, write_fd = os.pipe()
    os.write(write_fd, line)
    os.close(write_fd)
    sink, events = io.BytesIO(), queue.Queue()
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        job._Reader("stderr", pipe, sink, events, collections.deque(), TOKEN, 2).run()
    assert sink.getvalue() == line
    assert events.get_nowait() == ("eof", None)
