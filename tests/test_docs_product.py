"""The product's pages speak of the product: no round of work, internal issue or commit
named; no folder or host of the machine they were made on in any tracked file; a results
page short enough to read, whose glance table fits on a screen; and every `hvdtrain`
command the pages give parses with today's CLI."""

import contextlib
import io
import os
import re
import shlex
import socket
import subprocess

import pytest

from hvdtrain.cli import build_parser
from test_docs_figures import glance_table
from test_docs_links import MACHINE_PATH, ROOT, prose_lines, tracked_markdown

BENCHMARKS = "BENCHMARKS.md"
MOST_BENCHMARK_LINES = 1000
MOST_GLANCE_ROWS = 15
MOST_GLANCE_CELL_WORDS = 40
# How a lab notebook names its own making: a round of work, an internal issue, a commit.
WORK_ROUND = re.compile(
    r"\bsessions?\s+\d+|\(session\b|\ba (?:later|previous|next) session\b"
    r"|\b(?:internal )?issue\s+#?\d+\b|(?<![\w/.-])#\d{2,4}\b"
    r"|\bcommit\s+`?[0-9a-f]{7,40}\b|`[0-9a-f]{7,12}`", re.I)
# This machine's name as a host of a command (`-H vm:2`, `ssh vm`): a reader has no such
# host. Outside Markdown only checkouts and home folders count as this machine's: /tmp
# and /opt there are paths inside the images.
HOST_OF_A_COMMAND = re.compile(rf"(?<![\w.-]){re.escape(socket.gethostname())}:\d|"
                               rf"\bssh\s+{re.escape(socket.gethostname())}\b")
CHECKOUT_PATH = re.compile(r"(?<![\w$}.~])/(?:work|home)/\S*")


def product_pages() -> list[str]:
    """README, BENCHMARKS, the guides and the launchers' and images' READMEs."""
    return [path for path in tracked_markdown()
            if path in ("README.md", BENCHMARKS) or path.startswith("docs/")
            or path == "docker/README.md"
            or (path.startswith("launch/") and path.endswith("README.md"))]


def _lines(path: str) -> list[str]:
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        return fh.read().splitlines()


@pytest.mark.parametrize("path", product_pages())
def test_no_product_page_names_a_round_of_work_an_issue_or_a_commit(path):
    found = [f"{path}:{number}: {match.group(0)}" for number, line in
             enumerate(_lines(path), start=1) for match in WORK_ROUND.finditer(line)]
    assert found == []


def tracked_files_outside_tests() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout.split()
    return [path for path in listed if not path.startswith("tests/")
            and os.path.isfile(os.path.join(ROOT, path))]


def test_no_tracked_file_outside_tests_names_a_folder_or_host_of_its_machine():
    found = []
    for path in tracked_files_outside_tests():
        try:
            lines = _lines(path)
        except UnicodeDecodeError:
            continue  # a binary file (a PNG)
        paths = MACHINE_PATH if path.endswith(".md") else CHECKOUT_PATH
        for number, line in enumerate(lines, start=1):
            found += [f"{path}:{number}: {m.group(0)}" for m in paths.finditer(line)]
            found += [f"{path}:{number}: {m.group(0)}" for m in HOST_OF_A_COMMAND.finditer(line)]
    assert found == []


def test_benchmarks_is_a_results_page_of_at_most_1000_lines():
    assert len(_lines(BENCHMARKS)) <= MOST_BENCHMARK_LINES


def glance_rows() -> list[list[str]]:
    """The cells of each body row of the table under "Results at a glance"."""
    with open(os.path.join(ROOT, BENCHMARKS), encoding="utf-8") as fh:
        return glance_table(fh.read())


def test_the_glance_table_has_at_most_15_rows_of_cells_of_at_most_40_words():
    rows = glance_rows()
    assert 0 < len(rows) <= MOST_GLANCE_ROWS
    long_cells = [cell for row in rows for cell in row
                  if len(cell.split()) > MOST_GLANCE_CELL_WORDS]
    assert long_cells == []


# An `hvdtrain` command as a page gives it: to the end of the line, or a shell operator.
COMMAND = re.compile(r"(?<![\w/.-])hvdtrain\s+(?:[a-z][\w-]*)(?:[^|;&>#`\n])*")


def page_commands(path: str) -> list[tuple[int, str]]:
    """(line, command) for every `hvdtrain SUBCOMMAND ...` in the page's code: fenced
    blocks (continued lines joined) and inline code."""
    text = "\n".join(_lines(path))
    found: list[tuple[int, str]] = []
    fenced, joined, first = False, "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
            continue
        if fenced:
            if not joined:
                first = number
            joined += line.rstrip("\\").rstrip() + " "
            if not line.rstrip().endswith("\\"):
                found += [(first, m.group(0)) for m in COMMAND.finditer(joined)]
                joined = ""
    for number, line in enumerate(prose_lines(text), start=1):
        for code in re.findall(r"`([^`]+)`", line):
            found += [(number, m.group(0)) for m in COMMAND.finditer(code)]
    return found


# A word that stands for a value the reader chooses: N, DIR, <n>, $s, ..., runs/x-$s.
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z_0-9]*|.*[<$\u2026].*|\.\.\.|\[.*)$")


def parse_problem(command: str) -> str | None:
    """Why the CLI refuses `command`'s options (None if it takes them). A placeholder word
    (N, DIR, <n>, $s, ...) stands for a good value: an error about the option it fills
    is not counted, nor is a required argument the page leaves out."""
    try:  # [optional parts] left out
        given = shlex.split(re.sub(r"\[[^\]]*\]", " ", command))[1:]
    except ValueError:
        return None  # an unfinished quote: prose, not a command
    if not given or given[0] not in _subcommands():
        return None  # `hvdtrain`'s name in a sentence, not a command
    words, filled = [], set()
    for word in given:
        if word == "--":
            continue
        if PLACEHOLDER.match(word):
            if words and words[-1].startswith("-"):  # an option's value: a good one
                filled.add(words[-1])
                words.append("1")
            continue  # a positional stand-in, or "...": more the reader gives
        words.append(word)
    if words[-1].startswith("-"):
        filled.add(words[-1])  # an option named in a sentence, its value left to the reader
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(words)
    except SystemExit as exc:
        if exc.code in (0, None):
            return None
        message = (err.getvalue().strip().splitlines() or [str(exc)])[-1]
        if "the following arguments are required" in message or \
                any(re.search(rf"argument {re.escape(flag)}\b", message) for flag in filled):
            return None
        return message
    return None


def _subcommands() -> set[str]:
    action = next(a for a in build_parser()._actions if a.dest == "command")
    return set(action.choices)


@pytest.mark.parametrize("path", [p for p in product_pages() if p == "README.md"
                                  or p.startswith("docs/")])
def test_every_hvdtrain_command_of_the_readme_and_guides_parses(path):
    problems = [f"{path}:{number}: {command.strip()}: {problem}"
                for number, command in page_commands(path)
                if (problem := parse_problem(command))]
    assert problems == []
