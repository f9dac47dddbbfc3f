"""The documentation tells the truth about the CLI and about itself, in a second or two.

- Every `attune …` command line shown in README.md, CHANGELOG.md and docs/*.md (a line of a code
  block, or an inline code span, that starts with `attune` or `.venv/bin/attune`) parses with the
  real parser of attune/cli/main.py (parse only: nothing runs). Placeholders in the help's style
  stand for sample values: `N` is a number, `GPU_HOURS` a budget; other upper-case placeholders
  (RECIPE, ID, DIR, …) are strings the parser takes as they are. A line that is not meant to parse
  (a usage synopsis with `[--flag]`, an elided `…`) must not be shown as a command.
- Every relative link and image path exists, and every `#anchor` names a heading of its page.
- Every flag of every `attune` command is named somewhere in the docs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from attune.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
SAMPLES = {"N": "2", "GPU_HOURS": "8"}   # placeholders that stand for numbers

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _prose(text: str) -> str:
    """The page without its code blocks."""
    return FENCE.sub("", text)


def _block_lines(text: str):
    for block in FENCE.finditer(text):
        body = re.sub(r"\\\n\s*", " ", block.group(2))   # continuation lines
        yield from body.splitlines()


def _argv(line: str) -> list[str] | None:
    """The arguments of an `attune` command line, or None when the line is not one."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    if words and words[0] == "export":
        return None
    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words or not (words[0] == "attune" or words[0].endswith("/attune")):
        return None
    return words[1:]


def _names_a_command(line: str) -> bool:
    """`attune tune`, `attune sim oracle`: the name of a command in prose, not a command line."""
    parser = build_parser()
    for word in line.split()[1:]:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers or word not in subparsers[0].choices:
            return False
        parser = subparsers[0].choices[word]
    return True


def shown_commands() -> list[tuple[str, str]]:
    """(where, the command line) for every `attune` command line the pages show."""
    found = []
    for page in PAGES:
        text = _text(page)
        for line in _block_lines(text):
            if _argv(line) is not None:
                found.append((f"{page.name} (code block)", line.strip()))
        for span in INLINE.finditer(re.sub(r"``+", "", _prose(text))):
            line = " ".join(span.group(1).split())
            if line.startswith("attune ") and not _names_a_command(line):
                found.append((f"{page.name} (inline)", line))
    return found


def _parse(argv: list[str]) -> str | None:
    """None when the parser takes argv, else what it said."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        return None if exit_.code == 0 else (err.getvalue().strip().splitlines() or ["exit " + str(exit_.code)])[-1]
    if not getattr(args, "func", None):
        return "no command: the parser would print its help and exit 2"
    return None


def test_the_pages_show_commands():
    commands = shown_commands()
    assert len(commands) > 40, commands   # the scan finds them (README, campaign, gate, clusters, ...)
    assert any("README" in where for where, _ in commands)


@pytest.mark.parametrize("where, line", shown_commands())
def test_every_command_shown_parses(where, line):
    assert "…" not in line and "..." not in line, f"{where}: an elided command line: {line}"
    argv = [SAMPLES.get(word, word) for word in _argv(line)]
    problem = _parse(argv)
    assert problem is None, f"{where}: `{line}` does not parse: {problem}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", _prose(_text(page)), re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links() -> list[tuple[Path, str]]:
    found = []
    for page in PAGES:
        prose = INLINE.sub("", _prose(_text(page)))
        found += [(page, target) for target in LINK.findall(prose)]
    return found


def broken_links() -> list[str]:
    broken = []
    for page, target in links():
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{page.relative_to(REPO)}: {target} (no heading #{anchor} in {dest.name})")
    return broken


def test_every_relative_link_and_image_exists():
    assert len(links()) > 50
    assert any(target.endswith(".png") for _, target in links())
    assert broken_links() == []


def test_the_link_check_can_fail(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[fine](page.md#title) [gone](missing.md) ![gone](img/none.png) [bad](#nope)\n"
                    "```\n[in a code block](ignored.md)\n```\n")
    monkeypatch.setattr(f"{__name__}.PAGES", [page])
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert broken_links() == ["page.md: missing.md (no such file)", "page.md: img/none.png (no such file)",
                              "page.md: #nope (no heading #nope in page.md)"]


def test_the_command_check_can_fail():
    assert _parse(["tune", "recipe.toml", "--budget-gpu-hours", "8"]) is None
    assert _parse(["tune", "recipe.toml"]) is not None                        # a required flag missing
    assert _parse(["tune", "recipe.toml", "--budget-gpu-hours", "8", "--no-such-flag"]) is not None
    assert _parse(["campaigns", "[ACTION]"]) is not None                       # a usage synopsis
    assert _parse([]) is not None
    assert _argv("[attune 01617f623b43] baseline #0 ok") is None               # output, not a command
    assert _argv("ATTUNE_TORCHTITAN_LAUNCHER=slurm attune tune R --budget-gpu-hours 8") == [
        "tune", "R", "--budget-gpu-hours", "8"]


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    flags = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _flags(sub)
        else:
            flags |= {o for o in action.option_strings if o.startswith("--") and o not in ("--help", "--version")}
    return flags


def test_every_flag_is_documented():
    docs = "\n".join(_text(page) for page in PAGES)
    missing = sorted(flag for flag in _flags(build_parser()) if not re.search(re.escape(flag) + r"(?![\w-])", docs))
    assert missing == []
