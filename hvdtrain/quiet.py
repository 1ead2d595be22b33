"""Quiet start-up: TensorFlow's own start-up notices kept off every rank's output.

Every worker loads TensorFlow, and TensorFlow 2.21's C++ side greets each process with
informational lines: absl's "All log messages before absl::InitializeLog() is called
are written to STDERR", then the oneDNN notice, twice (two libraries, each with its own
absl). With 8 workers that is 32 lines before hvdtrain's first, and they hide what
matters. Measured on TF 2.21: TF_CPP_MIN_LOG_LEVEL does not reach them, not even at 3,
because they are written while the libraries load, before TensorFlow reads it. So
`quiet_startup` installs an import hook: the first `import tensorflow` of the process
(directly, or through keras or horovod.tensorflow) runs with file descriptor 2 turned
into a pipe to a small filter process (`hvdtrain.startup_notices`), which passes every
line but those notices on to the real stderr as it comes, in order, and outlives the
process: a FATAL line just before an abort (a CPU without AVX) still shows. Without a
stderr to dup, or a process to spare, the import runs as it is, notices and all.
After the import, TF_CPP_MIN_LOG_LEVEL=1 (only if unset) keeps
TensorFlow's later INFO lines off and its warnings and errors on.

What stays: every C++ warning, error and fatal line, every Python warning and
exception, and whatever else TensorFlow's import writes. oneDNN itself stays on: only
its notice goes (TF_ENABLE_ONEDNN_OPTS is never touched). A variable the user set is
left as it is; `--verbose` or HVDTRAIN_VERBOSE=1 leaves everything as TensorFlow has it.

`hvdtrain.cli.main` calls `quiet_startup` before it dispatches. horovodrun itself also
imports TensorFlow (its Gloo build check, in a forked process whose fd 2 it leaves
open), so `python -m hvdtrain.quiet horovodrun ...` runs any horovodrun with the same
hook; the venv's own horovodrun has it in already (launch/quiet-horovodrun.sh, which
launch/install.sh runs), so the plain `horovodrun ...` of the docs and `make demo` is
as quiet.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import runpy
import shutil
import subprocess
import sys
from typing import Iterator, MutableMapping

from hvdtrain import startup_notices

VERBOSE_ENV = "HVDTRAIN_VERBOSE"

# 1: C++ INFO lines off after the import, WARNING, ERROR and FATAL kept.
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1"}
# How long the end of an import waits for the filter to pass the last lines on. Only a
# process the import left running with fd 2 keeps the pipe open longer; the filter then
# goes on passing its lines on, after this process's own.
FILTER_WAIT_SECONDS = 2.0


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


@contextlib.contextmanager
def startup_notices_dropped() -> Iterator[None]:
    """fd 2 (C++ and Python alike) through the filter process while the block runs."""
    _flush_stderr()
    try:
        filtering = _start_filter()
    except (OSError, subprocess.SubprocessError):  # no fd 2 to dup, no process to spare
        filtering = None
    try:
        yield
    finally:
        if filtering is not None:
            _stop_filter(*filtering)


def _start_filter() -> tuple[int, subprocess.Popen]:
    """Start the filter on a new pipe, with this process's stderr as its own, and put the
    pipe behind fd 2; returns the saved fd 2 and the filter."""
    saved = os.dup(2)
    reader = writer = -1
    try:
        reader, writer = os.pipe()
        # -S -I: the standard library only; no site, no PYTHON* variables, no hvdtrain.
        process = subprocess.Popen([sys.executable, "-S", "-I", startup_notices.__file__],
                                   stdin=reader, stdout=subprocess.DEVNULL)
    except BaseException:
        for fd in (saved, reader, writer):
            if fd >= 0:
                os.close(fd)
        raise
    os.close(reader)
    os.dup2(writer, 2)
    os.close(writer)
    return saved, process


def _stop_filter(saved: int, process: subprocess.Popen) -> None:
    """Give fd 2 back, which closes the pipe's last end here, and let the filter finish."""
    _flush_stderr()
    os.dup2(saved, 2)
    os.close(saved)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(FILTER_WAIT_SECONDS)


def _flush_stderr() -> None:
    """Python's buffered stderr out before fd 2 changes; a stderr closed or gone is no
    reason to fail an import."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
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
