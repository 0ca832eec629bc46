"""Decoding of event records, in-process or in one helper process.

Avro decoding is most of a projector's CPU time and needs no state, so while the projector
judges and writes one batch, a helper process can decode the next: the projector sends raw
record values and gets back :data:`~projections.fastevent.Fields` tuples (or the reason a
record is undecodable), in the order it sent them. Both decoders run the same
:func:`decode_values`, so their results are identical.

The helper holds only its ends of two pipes (its stdin and stdout): when the projector dies,
even by SIGKILL, the helper reads end-of-file and exits; it never writes to the projection.
"""

from __future__ import annotations

import logging
import marshal
import os
import queue
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from effectlog.codec import event_codec
from effectlog.errors import BackendUnavailable, CodecError
from effectlog.log.base import Record
from projections.fastevent import Fields, fields_from_record

logger = logging.getLogger(__name__)

#: A record's fields, or (a str) why it could not be decoded.
Decoded = Fields | str
_DECODE_ERRORS = (CodecError, KeyError, ValueError, TypeError, AttributeError, IndexError)


def decode_values(values: list[bytes]) -> list[Decoded]:
    """Each value's fields, or ``"<ErrorType>: <message>"`` when it does not decode."""
    decode = event_codec().decode
    out: list[Decoded] = []
    for value in values:
        try:
            out.append(fields_from_record(decode(value)))
        except _DECODE_ERRORS as exc:
            out.append(f"{type(exc).__name__}: {exc}")
    return out


class InlineDecoder:
    """Decodes in the calling process, at :meth:`send`."""

    def __init__(self) -> None:
        self._results: deque[list[Decoded]] = deque()

    def send(self, values: list[bytes]) -> None:
        self._results.append(decode_values(values))

    def receive(self) -> list[Decoded]:
        """The results of the oldest request not yet received."""
        return self._results.popleft()

    def close(self) -> None:
        self._results.clear()


class ProcessDecoder:
    """Decodes in a helper process; requests are answered in the order they were sent.

    The helper is ``python -m projections.decoding`` talking over its stdin and stdout in
    ``marshal`` frames (the fields are plain values; marshal is several times faster than
    pickle here), so nothing of the parent's ``__main__`` is re-imported. Requests are
    written by a sender thread: with several requests in flight, the helper may block
    writing a large answer while this process would block writing the next request,
    unless the writing happens off the thread that reads the answers.
    """

    def __init__(self, timeout_s: float = 60.0) -> None:
        # -P: never import a stray ``projections`` package from the working directory.
        self._process = subprocess.Popen(
            [sys.executable, "-P", "-m", "projections.decoding"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, close_fds=True)
        assert self._process.stdin is not None and self._process.stdout is not None
        self._requests = Connection(os.dup(self._process.stdin.fileno()), readable=False)
        self._results = Connection(os.dup(self._process.stdout.fileno()), writable=False)
        self._process.stdin.close()
        self._process.stdout.close()
        self._timeout_s = timeout_s
        self._outbox: queue.SimpleQueue[list[bytes] | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_all, name="effectlog-decoder-send",
                                        daemon=True)
        self._sender.start()

    def send(self, values: list[bytes]) -> None:
        self._outbox.put(values)

    def _send_all(self) -> None:
        while True:
            values = self._outbox.get()
            if values is None:
                break
            try:
                self._requests.send_bytes(marshal.dumps(values))
            except OSError:  # the helper is gone; receive() reports it
                break
        self._requests.close()  # the helper sees end-of-file and exits

    def receive(self) -> list[Decoded]:
        try:
            if not self._results.poll(self._timeout_s):
                raise BackendUnavailable(f"the decoder process gave no answer in "
                                         f"{self._timeout_s}s")
            result: list[Decoded] = marshal.loads(self._results.recv_bytes())
        except (EOFError, OSError):
            raise BackendUnavailable("the decoder process died") from None
        return result

    def close(self) -> None:
        self._outbox.put(None)
        self._sender.join(2)
        try:
            self._process.wait(2)
        except subprocess.TimeoutExpired:  # stuck writing an answer nobody reads any more
            self._process.kill()
            self._process.wait()
        self._sender.join()
        self._results.close()


class Decoders:
    """Which decoder takes a batch: the helper process for big batches (``choice`` "auto",
    from ``process_min`` records; "process": always), else this process; once the helper
    failed, this process for good."""

    def __init__(self, choice: str, process_min: int) -> None:
        self.choice = choice
        self.process_min = process_min
        self.inline = InlineDecoder()
        self._helper: ProcessDecoder | None = None
        self._helper_failed = False

    def for_batch(self, size: int) -> InlineDecoder | ProcessDecoder:
        if self.choice == "inline" or self._helper_failed or (
                self.choice == "auto" and size < self.process_min):
            return self.inline
        if self._helper is None:
            self._helper = ProcessDecoder()
        return self._helper

    def drop_helper(self, failed: bool) -> None:
        """Stop the helper (``failed``: never start another one)."""
        if self._helper is not None:
            self._helper.close()
            self._helper = None
        self._helper_failed = self._helper_failed or failed


def serve(requests: Connection, results: Connection) -> None:
    """Helper process body: decode each request until the projector goes away."""
    while True:
        try:
            values: Any = marshal.loads(requests.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            results.send_bytes(marshal.dumps(decode_values(values)))
        except OSError:
            return


def main() -> None:
    """``python -m projections.decoding``: serve requests on stdin, answers on stdout."""
    results = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # anything printed by accident goes to stderr, not into the answers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the projector decides when to stop
    serve(Connection(os.dup(0), writable=False), results)


if __name__ == "__main__":
    main()


@dataclass(slots=True)
class InFlight:
    """A batch read from ``start`` and handed to a decoder, not applied yet."""

    partition: int
    start: int
    records: list[Record]
    decoder: InlineDecoder | ProcessDecoder


def by_partition(records: list[Record]) -> dict[int, list[Record]]:
    """``records`` grouped by partition, in order."""
    out: dict[int, list[Record]] = {}
    for record in records:
        out.setdefault(record.partition, []).append(record)
    return out
