"""The Markdown a user reads: every relative link and #anchor resolves, every guide the
README sends a user to starts with the commands it is about, no page names a folder of
the machine it was written on, and the option table names every option of `train`."""

import dataclasses
import os
import re
import subprocess
from urllib.parse import unquote

import pytest

from hvdtrain.config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# [text](target) and ![alt](target), with an optional "title"; not inside code.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# A guide's command block must open within this many lines after its title.
COMMANDS_WITHIN = 6


def tracked_markdown() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    if listed.returncode == 0 and listed.stdout.strip():
        paths = listed.stdout.split()
    else:  # not a git checkout (an sdist, the image): every .md file outside dot-folders
        paths = [os.path.relpath(os.path.join(folder, name), ROOT)
                 for folder, dirs, names in os.walk(ROOT)
                 if not re.search(r"(^|/)\.", os.path.relpath(folder, ROOT).replace(os.sep, "/"))
                 for name in names if name.endswith(".md")]
    # Files the work tree has: a tracked file deleted but not yet committed is gone.
    return sorted(path for path in paths if os.path.isfile(os.path.join(ROOT, path)))


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (links and headings there are not Markdown)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation but - and _ dropped, lowercase,
    spaces to -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters of any script, digits and _
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    # Explicit anchors (<a name="x"> or id="x") count too.
    found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    return found


def links(path: str) -> list[tuple[int, str]]:
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        lines = prose_lines(fh.read())
    found = []
    for number, line in enumerate(lines, start=1):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        found.extend((number, target) for target in LINK.findall(line))
    return found


def broken_links(path: str) -> list[str]:
    problems = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        folder = os.path.dirname(os.path.join(ROOT, path))
        resolved = os.path.normpath(os.path.join(folder, unquote(file_part))) if file_part \
            else os.path.join(ROOT, path)
        where = f"{path}:{number}: {target}"
        if not resolved.startswith(ROOT + os.sep) and resolved != ROOT:
            problems.append(f"{where}: points outside the repository")
        elif not os.path.exists(resolved):
            problems.append(f"{where}: {os.path.relpath(resolved, ROOT)} does not exist")
        elif anchor and resolved.endswith(".md") and anchor.lower() not in anchors(resolved):
            problems.append(f"{where}: no heading with the anchor #{anchor} in "
                            f"{os.path.relpath(resolved, ROOT)}")
    return problems


def test_the_anchor_rules_follow_github():
    assert slug("Local SGD in your own `model.fit`") == "local-sgd-in-your-own-modelfit"
    assert slug("What `--deterministic` costs (4 workers, sync, 2026-11-24)") == (
        "what---deterministic-costs-4-workers-sync-2026-11-24")
    assert slug("Hosts × slots: 2 × 2") == "hosts--slots-2--2"
    assert slug("snake_case and [a link](x.md)") == "snake_case-and-a-link"


def test_duplicate_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n## Setup\n```sh\n# Setup\n```\n## Setup\n## Setup\n")
    assert anchors(str(page)) == {"title", "setup", "setup-1", "setup-2"}


def test_there_is_markdown_to_check():
    paths = tracked_markdown()
    assert "README.md" in paths and "BENCHMARKS.md" in paths
    assert "docs/README.md" in paths


@pytest.mark.parametrize("path", tracked_markdown())
def test_every_relative_link_and_anchor_resolves(path):
    assert broken_links(path) == []


def guides_linked_from_readme() -> list[str]:
    return sorted({os.path.normpath(target.partition("#")[0])
                   for _, target in links("README.md")
                   if target.startswith("docs/") and target.partition("#")[0].endswith(".md")
                   and os.path.dirname(target.partition("#")[0]) == "docs"
                   and not target.partition("#")[0].endswith("README.md")})


def test_the_readme_sends_users_to_the_guides():
    assert len(guides_linked_from_readme()) >= 8


@pytest.mark.parametrize("guide", guides_linked_from_readme())
def test_every_guide_starts_with_its_commands(guide):
    with open(os.path.join(ROOT, guide), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    assert lines and lines[0].startswith("# "), f"{guide} does not start with a title"
    opening = lines[1:1 + COMMANDS_WITHIN]
    assert any(re.match(r"^```(sh|bash|console)\s*$", line) for line in opening), (
        f"{guide}: no command block within {COMMANDS_WITHIN} lines of the title")


# Folders of the machine the docs were written and measured on, which a reader's machine
# does not have: its checkouts and virtualenv (/work/..., /home/...), an absolute folder
# set as PATH or PYTHONPATH, and its CPU lock (/tmp/hvdtrain-...). Commands name folders
# of the reader's checkout instead ($PWD/.venv/bin, relative paths).
MACHINE_PATH = re.compile(r"(?<![\w$}.~])/(?:work|home)/\S*"   # checkouts, venvs
                          r"|\b(?:PYTHON)?PATH=/\S*"            # an absolute folder on a path
                          r"|/tmp/hvdtrain-\S*")                  # the machine's CPU lock


def machine_paths(path: str) -> list[str]:
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    return [f"{path}:{number}: {match.group(0)}" for number, line in enumerate(lines, start=1)
            for match in MACHINE_PATH.finditer(line)]


def test_a_machine_path_is_told_from_a_readers_folder():
    assert MACHINE_PATH.findall("export PYTHONPATH=/work/wt37 PATH=/work/main/.venv/bin:$PATH") == [
        "PYTHONPATH=/work/wt37", "PATH=/work/main/.venv/bin:$PATH"]
    assert MACHINE_PATH.findall("flock /tmp/hvdtrain-cpu.lock sh") == ["/tmp/hvdtrain-cpu.lock"]
    assert MACHINE_PATH.findall('sudo env PATH="$PWD/.venv/bin:$PATH" --volume $PWD/shared '
                                "-v ~/hvd-ssh:/root/.ssh:ro runs/work/x") == []


@pytest.mark.parametrize("path", tracked_markdown())
def test_no_page_names_a_folder_of_the_machine_it_was_measured_on(path):
    assert machine_paths(path) == []


def test_the_configuration_page_names_every_option_of_train():
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as fh:
        page = fh.read()
    options = ["--config", "--verbose"] + [
        "--" + option.name.replace("_", "-") for option in dataclasses.fields(TrainConfig)]
    assert [option for option in options if f"`{option}`" not in page] == []
