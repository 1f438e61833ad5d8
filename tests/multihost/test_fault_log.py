"""Capturing what the libraries print while a checkpoint is tried (`jaxrubric.fault_log`), in a
process of its own so that what reaches file descriptor 2 is what a terminal would show."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CAPTURE = """
import os, sys
from jaxrubric import fault_log

with fault_log.captured() as failed:
    print("python line", file=sys.stderr)
    os.write(2, b"c++ line\\n")
    fault_log.write_to_terminal("a lost host's verdict\\n")  # past the capture
failed.keep(sys.argv[1], "checkpoint of round 4: unreadable")
with fault_log.captured() as fine:
    os.write(2, b"a warning of a read that worked\\n")
fine.release()
fault_log.show_library_output(True)  # --debug
with fault_log.captured() as shown:
    os.write(2, b"shown as it happens\\n")
assert shown.text == ""
"""


def test_a_capture_keeps_fd_2_and_python_output_out_of_the_terminal(tmp_path):
    details = tmp_path / "fault_details.log"
    out = subprocess.run([sys.executable, "-c", _CAPTURE, str(details)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == ["a lost host's verdict", "a warning of a read that worked",
                                       "shown as it happens"]
    kept = details.read_text().splitlines()
    assert kept[0].startswith("=== ") and kept[0].endswith(" checkpoint of round 4: unreadable")
    assert sorted(kept[1:]) == ["c++ line", "python line"]


_LATE = """
import gc, os, sys
from jaxrubric import fault_log

# A coroutine of the checkpoint library's, suspended in a read that fails when it is closed.
code = compile("async def read():\\n    try:\\n        await wait()\\n    finally:\\n"
               "        raise ValueError('unawaited read failed')\\n",
               os.path.join(os.sep, "site-packages", "orbax", "serialization.py"), "exec")
space = {"wait": None}
exec(code, space)

class Wait:
    def __await__(self):
        yield

space["wait"] = Wait
held = space["read"]()
held.send(None)
with fault_log.captured() as failed:
    os.write(2, b"c++ line\\n")
failed.keep(sys.argv[1], "checkpoint of round 4: unreadable")
del held  # collected after the capture ended, as a still-referenced coroutine may be
gc.collect()
other = compile("async def mine():\\n    try:\\n        await wait()\\n    finally:\\n"
                "        raise ValueError('not a library read')\\n", "mine.py", "exec")
exec(other, space)
mine = space["mine"]()
mine.send(None)
del mine
gc.collect()
"""


def test_a_library_coroutine_collected_after_the_capture_reports_to_the_details(tmp_path):
    details = tmp_path / "fault_details.log"
    out = subprocess.run([sys.executable, "-c", _LATE, str(details)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "unawaited read failed" not in out.stderr
    assert "not a library read" in out.stderr  # anyone else's still reaches the terminal
    kept = details.read_text()
    assert "reported after the failed read's capture" in kept
    assert "unawaited read failed" in kept
