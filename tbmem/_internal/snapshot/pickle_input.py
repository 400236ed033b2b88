"""Reading a pickle stream for the snapshot reader: buffered input without protocol 4/5 FRAME headers,
and the decoding of text values, each refusing malformed input with
:class:`~tbmem._internal.snapshot.pickle_rows.SnapshotRefused`.

Example:
    >>> from tbmem._internal.snapshot.pickle_input import Unframer, text_int
    >>> Unframer().feed(b"\\x80\\x04\\x95\\x02\\x00\\x00\\x00\\x00\\x00\\x00\\x00K\\x01."), text_int(b"42")
    (b'\\x80\\x04K\\x01.', 42)
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO, Callable

from tbmem._internal.snapshot.pickle_rows import Limits, SnapshotRefused

__all__ = ["Unframer", "Input", "utf8", "ascii_text", "text_int"]

_CHUNK = 16 << 20


class Unframer:
    """Removes protocol 4/5 FRAME headers while reading, so that events never straddle one.

    Frames only group opcodes for buffered reading and always start at an opcode boundary; a
    frame is followed by the next FRAME header, except where the pickler wrote a large value
    outside frames: there the unframer stops and passes the rest through (the interpreter
    still reads FRAME opcodes itself).
    """

    def __init__(self) -> None:
        self.state = "start"  # start, header, frame, pass
        self.left = 0
        self.carry = b""

    def feed(self, raw: bytes) -> bytes:
        data = self.carry + raw if self.carry else raw
        self.carry = b""
        view = memoryview(data)  # the frames' bytes are copied once, by the join
        out: list[Any] = []
        i = 0
        n = len(data)
        while i < n:
            if self.state == "pass":
                out.append(view[i:])
                break
            if self.state == "frame":
                take = min(self.left, n - i)
                out.append(view[i:i + take])
                i += take
                self.left -= take
                if self.left == 0:
                    self.state = "header"
                continue
            if self.state == "start":
                if n - i < 2:
                    self.carry = data[i:]
                    break
                out.append(view[i:i + 2])
                framed = data[i] == 0x80 and data[i + 1] >= 4
                i += 2
                self.state = "header" if framed else "pass"
                continue
            # header: a FRAME opcode and its 8-byte length, or the end of framing
            if data[i] != 0x95:
                self.state = "pass"
                continue
            if n - i < 9:
                self.carry = data[i:]
                break
            self.left = int.from_bytes(data[i + 1:i + 9], "little")
            i += 9
            self.state = "frame" if self.left else "header"
        return b"".join(out)


class Input:
    """The unframed bytes of a pickle file, read in chunks: ``buf[pos:]`` is what is left to parse."""

    def __init__(self, fh: BinaryIO, limits: Limits, progress: Callable[[int], None] | None) -> None:
        self.fh = fh
        self.limits = limits
        self.progress = progress
        self.buf = b""
        self.pos = 0
        self.consumed = 0  # bytes of the (unframed) stream before buf
        self.read_bytes = 0
        self.unframe = Unframer()
        self.eof = False
        # the next chunk is read and unframed on a thread while this one is parsed (reading and
        # joining bytes release the GIL); one chunk ahead at most
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: Future[tuple[bytes, bytes]] | None = None

    def _chunk(self, n: int) -> tuple[bytes, bytes]:
        raw = self.fh.read(n)
        return raw, self.unframe.feed(raw) if raw else b""

    def close(self) -> None:
        """Stop reading ahead (waits for a chunk being read)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = self._ahead = None

    def _fill(self, need: int, strict: bool = True) -> None:
        while len(self.buf) - self.pos < need and not self.eof:
            if self._ahead is not None:
                raw, data = self._ahead.result()
                self._ahead = None
            else:
                raw, data = self._chunk(max(_CHUNK, need))
            if not raw:
                self.eof = True
                if self.unframe.carry:
                    raise SnapshotRefused("the pickle is truncated (it ends inside a FRAME header)")
                break
            if len(raw) >= _CHUNK:  # a large file: read the next chunk meanwhile
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tbmem-pickle-read")
                self._ahead = self._pool.submit(self._chunk, _CHUNK)
            self.read_bytes += len(raw)
            self.consumed += self.pos
            self.buf = self.buf[self.pos:] + data
            self.pos = 0
            if self.progress is not None:
                self.progress(self.read_bytes)
        if strict and len(self.buf) - self.pos < need:
            raise SnapshotRefused("the pickle is truncated (it ends inside an opcode)")

    def _take(self, n: int) -> bytes:
        if len(self.buf) - self.pos < n:
            self._fill(n)
        p = self.pos
        self.pos = p + n
        return self.buf[p:p + n]

    def _line(self) -> bytes:
        while True:
            i = self.buf.find(b"\n", self.pos)
            if i >= 0:
                out = self.buf[self.pos:i]
                self.pos = i + 1
                return out
            if self.eof or len(self.buf) - self.pos > self.limits.max_string_bytes:
                raise SnapshotRefused("the pickle is truncated (a text opcode has no end of line)")
            self._fill(len(self.buf) - self.pos + 1)


def utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise SnapshotRefused("a string is not valid UTF-8") from None


def ascii_text(data: bytes) -> str:
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def text_int(line: bytes) -> int:
    if len(line) > 40:
        raise SnapshotRefused("a text integer is longer than 40 digits")
    try:
        return int(line)
    except ValueError:
        raise SnapshotRefused("a text integer opcode holds no number") from None
