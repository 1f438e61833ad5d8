"""The project speaks only of itself, and the paths its documentation cites exist.

1. No tracked source, documentation or notebook file (`git ls-files '*.py' '*.md' '*.ipynb'`)
   refers to numbered development steps or tracker entries ("stop 42", "issue 15", "#12"), or
   to them by a phrase ("this stop", "the issue's bar"): a reader of the repository has none
   of them. Results carry a date, the command and the commit instead. A failure names every
   offending file:line. Legitimate uses go in `ALLOWED`, each with its reason.
2. Every repository path that README.md and docs/*.md cite (in code spans, code blocks and
   markdown links, images included) exists, and every link's #anchor names a heading of its
   target.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Numbered steps and tracker entries, and the phrases that point at them without a number.
# "stop" alone is a normal word (the stop token, a run that stops), so only the forms that
# name a development step are listed.
PATTERNS = (
    re.compile(r"\b(stop|issue)s? #?[0-9]+", re.IGNORECASE),
    re.compile(r"\bstop-[0-9]+", re.IGNORECASE),
    re.compile(r"\b(this|that|each|every|next|previous|within the) stop\b(?! tokens?\b)",
               re.IGNORECASE),
    re.compile(r"\bstop's\b", re.IGNORECASE),
    re.compile(r"\b(this|that|the) issue\b", re.IGNORECASE),
    re.compile(r"\bissue's\b", re.IGNORECASE),
)

# (path, text on the line, why it is allowed; "" allows every line of the file). An upstream
# bug's URL, for example, would go here with the reason it is cited.
ALLOWED: tuple[tuple[str, str, str], ...] = (
    ("tests/test_project_words.py", "", "this file spells out the patterns it forbids"),
)


def tracked(*patterns: str) -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the tracked files)")
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line]


def allowed(path: str, line: str) -> bool:
    return any(path == p and text in line for p, text, _ in ALLOWED)


def test_no_numbered_steps_or_tracker_entries():
    found = []
    for path in tracked("*.py", "*.md", "*.ipynb"):
        file = ROOT / path
        if not file.is_file():  # deleted in the working tree, not yet committed
            continue
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if any(p.search(line) for p in PATTERNS) and not allowed(path, line):
                found.append(f"{path}:{number}: {line.strip()[:120]}")
    assert not found, ("numbered development steps or tracker entries (say the date, the "
                       "command and the commit instead):\n" + "\n".join(found))


def test_the_patterns_catch_what_they_should():
    bad = ["measured at stop 43", "Issue 15's bar", "issues #12", "the stop-39 verifier",
           "within the stop", "this stop's reruns", "the issue's question"]
    good = ["without the stop token", "lengths including the stop\n", "the run stops at 3",
            "a stop agreed across hosts", "every stop token"]
    assert all(any(p.search(text) for p in PATTERNS) for text in bad)
    assert not any(p.search(text) for text in good for p in PATTERNS)


# ------------------------------------------------------------------------------ cited paths
DOCS = ("README.md", "docs/*.md")
PREFIXES = ("jaxrubric", "configs", "docs", "benchmarks", "tests", "launch", "colab", ".ci")
# A path token: one of the repository's top-level folders, then path characters; not part of
# a longer path (`/ckpt/docs/x`) or a module name (`jaxrubric.toy`).
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./{},*-]*)" % "|".join(re.escape(p) for p in PREFIXES))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")  # RECIPE in configs/RECIPE.py, NAME, ...


def expand(path: str) -> list[str]:
    """`configs/qwen3_8b_{dynamic_rubric,genrubric}.py` -> both names."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for alt in match.group(1).split(",")
            for p in expand(path[:match.start()] + alt + path[match.end():])]


def exists(path: str) -> bool:
    """Whether a cited path exists; a placeholder segment (`configs/RECIPE.py`) or a glob
    (`runs/*/x`) stands for any file, so only the folder before it must exist."""
    path = path.rstrip(".,;:)").split("::")[0]
    parts = path.split("/")
    for i, part in enumerate(parts):
        stem = part.split(".")[0]
        if "*" in part or PLACEHOLDER.match(stem):
            return (ROOT / "/".join(parts[:i])).is_dir()
    return (ROOT / path).exists()


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(file: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in file.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def doc_files() -> list[str]:
    return tracked(*DOCS)


def test_cited_repository_paths_exist():
    missing = []
    for doc in doc_files():
        file = ROOT / doc
        if not file.is_file():
            continue
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            for token in PATH.findall(line):
                for path in expand(token):
                    if not exists(path):
                        missing.append(f"{doc}:{number}: {path}")
    assert not missing, "cited paths that do not exist:\n" + "\n".join(missing)


def test_links_and_their_anchors_resolve():
    dead = []
    for doc in doc_files():
        file = ROOT / doc
        if not file.is_file():
            continue
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # https:, mailto: (not checked offline)
                    continue
                path, _, anchor = target.partition("#")
                dest = (file.parent / path).resolve() if path else file
                if not dest.exists():
                    dead.append(f"{doc}:{number}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    dead.append(f"{doc}:{number}: {target} (no such heading)")
    assert not dead, "dead links:\n" + "\n".join(dead)
