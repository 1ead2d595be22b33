"""TensorFlow's start-up notices, told from the lines around them; and the filter process
that passes a stream on without them (`hvdtrain.quiet` puts it behind fd 2 while
TensorFlow loads).

The filter is a process, not a thread: TensorFlow's FATAL line (a CPU without AVX, say)
is followed at once by abort(), which ends every thread of the process before one could
pass the line on. A process of its own outlives it: it reads the pipe to its end, which
comes when the last writer is gone, whole or aborted.

Run as `python -S -I startup_notices.py`: stdin to stderr, the notices left out, each
line passed on as it comes. It imports the standard library only (no site, no hvdtrain).
"""

import os
import re
import signal
import sys

# absl's preamble, and an absl INFO line ("I0000 00:00:1795610010.915993  6588 port.cc:153] ...").
_NOTICE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called "
                     r"are written to STDERR$|I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\] ")
# The CPU-instructions notice goes on for one more line, without a prefix of its own.
_CONTINUED = ("cpu_feature_guard.cc", "To enable the following instructions")


class NoticeFilter:
    """Tells, line by line in order, whether a line is one of the notices."""

    def __init__(self):
        self._previous_dropped = ""

    def keeps(self, line: str) -> bool:
        continued = (_CONTINUED[0] in self._previous_dropped
                     and line.startswith(_CONTINUED[1]))
        if _NOTICE.match(line) or continued:
            self._previous_dropped = line
            return False
        self._previous_dropped = ""
        return True


def drop_startup_notices(text: str) -> str:
    """`text` without absl's preamble and INFO lines (the CPU notice's second line too)."""
    notices = NoticeFilter()
    return "".join(line for line in text.splitlines(keepends=True) if notices.keeps(line))


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def pass_on(source, fd: int) -> None:
    """Every line of the binary stream `source` but the notices, to `fd`, as each comes.
    A write that fails (fd closed, its reader gone) loses that line only: the source is
    still read to its end, so its writer never blocks on a full pipe."""
    notices = NoticeFilter()
    for line in source:
        if notices.keeps(line.decode("utf-8", errors="replace")):
            try:
                _write_all(fd, line)
            except OSError:
                pass


if __name__ == "__main__":
    # Ctrl-C is for the process whose output this passes on; this one ends at the pipe's end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pass_on(sys.stdin.buffer, 2)
