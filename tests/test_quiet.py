"""Quiet start-up (hvdtrain/quiet.py): what it sets, what it leaves, what it drops."""

import os
import select
import signal
import subprocess
import sys

from hvdtrain import quiet
from hvdtrain.cli import build_parser
from hvdtrain.startup_notices import drop_startup_notices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What TensorFlow 2.21 printed at `import tensorflow` here, with a real warning between.
STARTUP = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1795610010.915993    6588 port.cc:153] oneDNN custom operations are on. "
    "You may see slightly different numerical results.\n"
    "I0000 00:00:1795609963.113034    6490 cpu_feature_guard.cc:227] This TensorFlow binary "
    "is optimized to use available CPU instructions in performance-critical operations.\n"
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow.\n"
    "W0000 00:00:1795610011.000001    6588 some_op.cc:12] a real warning\n"
    "E0000 00:00:1795610011.000002    6588 other_op.cc:34] a real error\n"
    "/usr/lib/python3/site-packages/x.py:1: UserWarning: a Python warning\n"
)


def test_quiet_startup_sets_the_log_level_only_when_unset():
    environ = {}
    assert quiet.quiet_startup(environ=environ) == {"TF_CPP_MIN_LOG_LEVEL": "1"}
    assert environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
    mine = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    assert quiet.quiet_startup(environ=mine) == {}
    assert mine == {"TF_CPP_MIN_LOG_LEVEL": "0"}


def test_verbose_flag_or_variable_leaves_the_environment_alone_and_passes_it_on():
    environ = {}
    assert quiet.quiet_startup(verbose=True, environ=environ) == {}
    assert environ == {quiet.VERBOSE_ENV: "1"}  # for the workers a bench or sweep starts
    environ = {quiet.VERBOSE_ENV: "1"}
    assert quiet.quiet_startup(environ=environ) == {}
    assert "TF_CPP_MIN_LOG_LEVEL" not in environ
    assert not quiet.verbose_requested(False, {quiet.VERBOSE_ENV: "0"})
    assert not quiet.verbose_requested(False, {})


def test_oneDNN_itself_is_never_turned_off():
    environ = {}
    quiet.quiet_startup(environ=environ)
    assert "TF_ENABLE_ONEDNN_OPTS" not in environ


def test_only_the_startup_notices_are_dropped_and_warnings_and_errors_kept():
    kept = drop_startup_notices(STARTUP)
    assert kept.splitlines() == [
        "W0000 00:00:1795610011.000001    6588 some_op.cc:12] a real warning",
        "E0000 00:00:1795610011.000002    6588 other_op.cc:34] a real error",
        "/usr/lib/python3/site-packages/x.py:1: UserWarning: a Python warning",
    ]


def test_a_line_like_the_cpu_notice_continuation_is_kept_elsewhere():
    assert drop_startup_notices("To enable the following instructions: mine\n") == (
        "To enable the following instructions: mine\n")


def test_verbose_is_a_global_flag_accepted_before_or_after_the_command():
    parser = build_parser()
    assert parser.parse_args(["--verbose", "train"]).verbose
    assert parser.parse_args(["train", "--verbose"]).verbose
    assert parser.parse_args(["data", "bench", "--verbose"]).verbose
    assert not parser.parse_args(["train"]).verbose


def test_the_cli_module_loads_without_tensorflow_so_the_hook_comes_first():
    probe = ("import sys, hvdtrain.cli; "
             "print(sorted(m for m in ('tensorflow', 'keras', 'horovod') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True, env=dict(os.environ, PYTHONPATH=ROOT)).stdout
    assert out.strip() == "[]"


NOTICE = "I0000 00:00:1.5   12 port.cc:153] oneDNN custom operations are on.\n"
KEPT = "W0000 00:00:1.6   12 op.cc:1] kept\n"


def _quiet_import(body: str) -> str:
    """A child's script whose "import" writes a notice and a warning straight to fd 2, as
    C++ does, then runs `body` (indented into the block)."""
    return ("import os, sys\n"
            "from hvdtrain.quiet import startup_notices_dropped\n"
            "with startup_notices_dropped():\n"
            "    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called '\n"
            "                b'are written to STDERR\\n')\n"
            f"    os.write(2, {NOTICE.encode()!r})\n"
            f"    os.write(2, {KEPT.encode()!r})\n"
            + "".join(f"    {line}\n" for line in body.splitlines()))


def _child_env(**more) -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, **more)


def test_what_a_quiet_import_writes_to_fd_2_is_written_back_without_the_notices(tmp_path):
    script = _quiet_import("pass") + "os.write(2, b'after\\n')\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, check=True, env=_child_env())
    assert result.stderr == KEPT + "after\n"


def test_a_fatal_line_before_an_abort_inside_the_import_still_shows():
    # TensorFlow on a CPU without AVX: a FATAL line, then abort() ends the process at once.
    fatal = "F0000 00:00:1.7   12 cpu_feature_guard.cc:9] The TensorFlow library was compiled " \
            "to use AVX instructions, but these aren't available on your machine."
    script = _quiet_import(f"os.write(2, {fatal.encode()!r} + b'\\n')\nos.abort()")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, env=_child_env())
    assert result.returncode == -signal.SIGABRT
    assert result.stderr == KEPT + fatal + "\n"


def test_kept_lines_show_as_they_come_not_when_the_import_ends():
    # The "import" waits for the test to read its warning: held back, it would never end.
    script = _quiet_import("sys.stdin.readline()")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=_child_env())
    try:
        readable, _, _ = select.select([child.stderr], [], [], 60)
        assert readable, "the kept line did not come while the import ran"
        assert child.stderr.readline() == KEPT
        child.stdin.write("go on\n")
        child.stdin.flush()
        assert child.wait(60) == 0
    finally:
        child.kill()
        child.communicate()


def test_an_import_survives_a_stderr_whose_reader_is_gone_or_that_is_closed():
    script = _quiet_import("pass") + "print('imported')\n"
    reader, writer = os.pipe()
    os.close(reader)  # `... 2>&1 | head -1` after head has gone
    try:
        gone = subprocess.run([sys.executable, "-c", script], stderr=writer, capture_output=False,
                              stdout=subprocess.PIPE, text=True, timeout=60, env=_child_env())
    finally:
        os.close(writer)
    # No fd 2 at all (`2>&-`): the import runs as it is.
    bare = "from hvdtrain.quiet import startup_notices_dropped\n" \
           "with startup_notices_dropped():\n    print('imported')\n"
    closed = subprocess.run(["sh", "-c", 'exec "$0" -c "$1" 2>&-', sys.executable, bare],
                            stdout=subprocess.PIPE, text=True, timeout=60, env=_child_env())
    assert (gone.returncode, gone.stdout) == (0, "imported\n")
    assert (closed.returncode, closed.stdout) == (0, "imported\n")


def test_a_quiet_import_needs_no_writable_temporary_folder(tmp_path):
    # As on a machine where TMPDIR, /tmp and the working folder all refuse a file.
    script = f"import tempfile\ntempfile.tempdir = {str(tmp_path / 'missing')!r}\n" + \
        _quiet_import("pass")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, env=_child_env())
    assert (result.returncode, result.stderr) == (0, KEPT)


def test_a_module_runs_quietly_with_its_own_arguments(tmp_path):
    # bench's jobs: `python -m hvdtrain.quiet -m hvdtrain.benchmarks.throughput PLAN RESULTS`.
    (tmp_path / "job_module.py").write_text(
        "import sys\n"
        # By name: under `-m hvdtrain.quiet` the hook's class lives in __main__.
        "hooked = any(type(f).__name__ == '_QuietTensorFlowFinder' for f in sys.meta_path)\n"
        "print(__name__, sys.argv[1:], hooked)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]))
    env.pop("HVDTRAIN_VERBOSE", None)
    result = subprocess.run([sys.executable, "-m", "hvdtrain.quiet", "-m", "job_module", "a", "b"],
                            capture_output=True, text=True, timeout=60, check=True, env=env)
    assert result.stdout == "__main__ ['a', 'b'] True\n"
