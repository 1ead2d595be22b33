"""Quiet start-up: TensorFlow's own start-up notices kept off every rank's output.

Every worker loads TensorFlow, and TensorFlow 2.21's C++ side greets each process with
informational lines: absl's "All log messages before absl::InitializeLog() is called
are written to STDERR", then the oneDNN notice, twice (two libraries, each with its own
absl). With 8 workers that is 32 lines before hvdtrain's first, and they hide what
matters. Measured on TF 2.21: TF_CPP_MIN_LOG_LEVEL does not reach them, not even at 3,
because they are written while the libraries load, before TensorFlow reads it. So
`quiet_startup` installs an import hook: the first `import tensorflow` of the process
(directly, or through keras or horovod.tensorflow) runs with file descriptor 2 caught
in a temporary file, and when it returns every line but those notices is written back
to stderr, in order (a Python exception on the way is written back too; only a crash of
the process inside the import, a segfault, would lose those lines: --verbose shows them).
After the import, TF_CPP_MIN_LOG_LEVEL=1 (only if unset) keeps
TensorFlow's later INFO lines off and its warnings and errors on.

What stays: every C++ warning, error and fatal line, every Python warning and
exception, and whatever else TensorFlow's import writes. oneDNN itself stays on: only
its notice goes (TF_ENABLE_ONEDNN_OPTS is never touched). A variable the user set is
left as it is; `--verbose` or HVDTRAIN_VERBOSE=1 leaves everything as TensorFlow has it.

`hvdtrain.cli.main` calls `quiet_startup` before it dispatches. horovodrun itself also
imports TensorFlow (its Gloo build check, in a forked process whose fd 2 it leaves
open), so `python -m hvdtrain.quiet horovodrun ...` runs horovodrun with the same
hook; `make demo` launches that way.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import runpy
import shutil
import sys
import tempfile
from typing import Iterator, MutableMapping

VERBOSE_ENV = "HVDTRAIN_VERBOSE"

# 1: C++ INFO lines off after the import, WARNING, ERROR and FATAL kept.
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1"}

# absl's preamble, and an absl INFO line ("I0000 00:00:1795610010.915993  6588 port.cc:153] ...").
_NOTICE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called "
                     r"are written to STDERR$|I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\] ")
# The CPU-instructions notice goes on for one more line, without a prefix of its own.
_CONTINUED = ("cpu_feature_guard.cc", "To enable the following instructions")


def verbose_requested(flag: bool = False, environ: MutableMapping[str, str] | None = None) -> bool:
    """--verbose, or HVDTRAIN_VERBOSE set to anything but empty or 0."""
    environ = os.environ if environ is None else environ
    return flag or environ.get(VERBOSE_ENV, "").strip() not in ("", "0")


def quiet_startup(verbose: bool = False,
                  environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Quiet TensorFlow's start-up in this process; returns the variables it set.

    With `verbose` (or HVDTRAIN_VERBOSE=1) nothing changes, and HVDTRAIN_VERBOSE=1 is
    exported so the processes this one starts (the workers of bench and sweep) are
    verbose too. Otherwise the variables of QUIET_ENV the user left unset are set, and
    the import hook goes in, unless TensorFlow is already loaded (then it is too late).
    """
    environ = os.environ if environ is None else environ
    if verbose_requested(verbose, environ):
        environ[VERBOSE_ENV] = "1"
        return {}
    chosen = {name: value for name, value in QUIET_ENV.items() if name not in environ}
    environ.update(chosen)
    if "tensorflow" not in sys.modules and not any(
            isinstance(finder, _QuietTensorFlowFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowFinder())
    return chosen


def drop_startup_notices(text: str) -> str:
    """`text` without absl's preamble and INFO lines (the CPU notice's second line too)."""
    kept, previous_dropped = [], ""
    for line in text.splitlines(keepends=True):
        continued = _CONTINUED[0] in previous_dropped and line.startswith(_CONTINUED[1])
        if _NOTICE.match(line) or continued:
            previous_dropped = line
            continue
        previous_dropped = ""
        kept.append(line)
    return "".join(kept)


@contextlib.contextmanager
def startup_notices_dropped() -> Iterator[None]:
    """Catch fd 2 (C++ and Python alike) in a file; write back all but the notices."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            rest = drop_startup_notices(caught.read().decode("utf-8", errors="replace"))
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, its module run with the start-up notices dropped."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with startup_notices_dropped():
            self.loader.exec_module(module)


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` once, as the other finders would, and wraps its loader."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once: the other finders answer from here on
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def main(argv: list[str] | None = None) -> int:
    """`python -m hvdtrain.quiet COMMAND ...`: run a Python console script quietly;
    `python -m hvdtrain.quiet -m MODULE ...`: run a module so (bench's jobs, which
    import TensorFlow at the top of the module, before any hook of their own)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv == ["-m"]:
        print("usage: python -m hvdtrain.quiet COMMAND [ARGS...] | -m MODULE [ARGS...]  "
              "(e.g. horovodrun -np 2 ...)", file=sys.stderr)
        return 2
    if argv[0] == "-m":
        quiet_startup()
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = shutil.which(argv[0])
    if script is None:
        print(f"hvdtrain: error: {argv[0]}: command not found on PATH", file=sys.stderr)
        return 127
    quiet_startup()
    sys.argv = [script, *argv[1:]]
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    # Through the imported module, not this __main__ copy of it: the command run here
    # (hvdtrain's CLI, say) calls hvdtrain.quiet.quiet_startup itself, which must see the
    # hook already in as one of its own and not put in a second.
    from hvdtrain.quiet import main as imported_main

    sys.exit(imported_main())
