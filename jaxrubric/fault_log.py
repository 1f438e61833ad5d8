"""A handled fault shows one line on the terminal; what the libraries said about it goes to a
file in the workdir.

A damaged checkpoint makes orbax and TensorStore report the failed read their own way: the
tracebacks of coroutines that were never awaited (printed through `sys.unraisablehook` when
they are collected, which may be rounds later), absl and Python logging, and TensorStore's C++
log on file descriptor 2. That is scores of lines before jaxrubric's own line saying what it
does about it. `captured()` collects all of it while a checkpoint is tried (file descriptor 2
and `sys.stderr` both point at a temporary file, and the garbage is collected before they are
given back); then `Capture.keep` appends it to the workdir's details file when the attempt
failed, and `Capture.release` writes it to stderr as it would have appeared when it did not.
`show_library_output(True)` (`jaxrubric --debug`) leaves everything on the terminal.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from etils import epath

_SHOW = False
_TERMINAL_FD: int | None = None  # stderr's own file descriptor while a capture holds fd 2
# The details file of the last failed read kept: where a coroutine that read left unawaited
# reports if it is collected only after the capture ended (it may still be referenced then).
_LATE_DETAILS: str | None = None
_LIBRARIES = (f"{os.sep}orbax{os.sep}", f"{os.sep}tensorstore{os.sep}")


def show_library_output(show: bool) -> None:
    """True: nothing is captured (`--debug`), the libraries print as they do."""
    global _SHOW
    _SHOW = show


def write_to_terminal(text: str) -> None:
    """Writes `text` to stderr past any capture: for a line that must be seen even while a
    checkpoint is tried (a lost host's verdict, just before the process ends)."""
    try:
        os.write(2 if _TERMINAL_FD is None else _TERMINAL_FD, text.encode())
    except OSError:  # the capture ended meanwhile: fd 2 is the terminal again
        os.write(2, text.encode())


def details_file(workdir: str, process: int) -> str:
    """The workdir's file of captured details: `fault_details.log` for process 0,
    `fault_details.process<i>.log` for the others of a multi-process run."""
    name = "fault_details.log" if process == 0 else f"fault_details.process{process}.log"
    return os.path.join(workdir, name)


class Capture:
    """What the libraries wrote during a `captured()` block."""

    def __init__(self, text: str = ""):
        self.text = text

    def keep(self, path: str, title: str) -> None:
        """Appends the capture, under a dated `title` line, to `path`: a local file, or a URL
        (rewritten whole: object stores do not append)."""
        global _LATE_DETAILS
        if _LATE_DETAILS is None and not _SHOW:
            sys.unraisablehook = _late_unraisable_hook(sys.unraisablehook)
        _LATE_DETAILS = path
        entry = f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {title}\n{self.text}"
        entry += "" if entry.endswith("\n") else "\n"
        if "://" not in path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(entry)
            return
        target = epath.Path(path)
        target.write_text((target.read_text() if target.exists() else "") + entry)

    def release(self) -> None:
        """Writes the capture to stderr: a block that needed no handling prints as usual."""
        if self.text:
            sys.stderr.write(self.text)
            sys.stderr.flush()


def _late_unraisable_hook(previous):
    """`sys.unraisablehook` that sends an unawaited checkpoint-library coroutine's report to
    the last failed read's details file; anything else goes to `previous`."""

    def hook(unraisable) -> None:
        code = getattr(unraisable.object, "cr_code", None)
        if _LATE_DETAILS is None or code is None or not any(
                part in code.co_filename for part in _LIBRARIES):
            previous(unraisable)
            return
        text = "".join(traceback.format_exception(
            unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback))
        Capture(f"Exception ignored in: {unraisable.object!r}\n{text}").keep(
            _LATE_DETAILS, "reported after the failed read's capture")

    return hook


@contextmanager
def captured() -> Iterator[Capture]:
    """Collects everything written to stderr, from Python or C++, inside the block."""
    global _TERMINAL_FD
    capture = Capture()
    if _SHOW:
        yield capture
        return
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as sink:
        saved_fd, saved_stderr = os.dup(2), sys.stderr
        _TERMINAL_FD = saved_fd
        os.dup2(sink.fileno(), 2)
        # Over file descriptor 2, not the sink: a stream kept past the block writes to stderr.
        sys.stderr = open(2, "w", closefd=False, encoding="utf-8", errors="replace")
        try:
            yield capture
        finally:
            gc.collect()  # coroutines left unawaited by a failed read report now
            sys.stderr.flush()
            saved_stderr.flush()
            sys.stderr = saved_stderr
            os.dup2(saved_fd, 2)
            _TERMINAL_FD = None
            os.close(saved_fd)
            sink.seek(0)
            capture.text = sink.read().decode("utf-8", errors="replace")
