"""The pages a user reads: every relative link and #anchor resolves, figures live on one page
(docs/results.md), and the words speak of the software and the machines, not of how the work on it
was organised."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Phrases of the workshop, not of the software: a reader cannot know what they refer to.
WORKSHOP = re.compile(r"\blent\b|\bsession'?s? end\b|\bthis session\b|\ba session'?s?\b|\bnext session\b|"
                      r"\bsessions? on\b|\bthe issue\b|\bissue \d+\b|\bthe card\b|\bdesign card\b|"
                      r"\.\./shared|anchors\.md|\bdevice time\b", re.IGNORECASE)


def _tracked(*patterns):
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.split() if os.path.exists(os.path.join(ROOT, f))]


def slug(heading):
    """GitHub's anchor of a Markdown heading: lower case, link text for links, punctuation but hyphens
    and underscores dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    found, in_code = set(), False
    for line in open(path):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            base = slug(line.lstrip("#"))
            n = 0
            while (base if n == 0 else "%s-%d" % (base, n)) in found:
                n += 1
            found.add(base if n == 0 else "%s-%d" % (base, n))
    return found


def user_pages():
    return _tracked("README.md", "docs/*.md", "sandbox/*.md", "bench/results/*.md", "bench/results/**/*.md")


def test_every_relative_link_resolves():
    broken = []
    for page in user_pages():
        here = os.path.dirname(os.path.join(ROOT, page))
        for i, line in enumerate(open(os.path.join(ROOT, page)), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # a web address
                path, _, anchor = target.partition("#")
                full = os.path.normpath(os.path.join(here, path)) if path else os.path.join(ROOT, page)
                if not os.path.exists(full):
                    broken.append("%s:%d %s (no such file)" % (page, i, target))
                elif anchor and full.endswith(".md") and anchor not in anchors(full):
                    broken.append("%s:%d %s (no such heading)" % (page, i, target))
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("kind", ["pages", "code"])
def test_no_workshop_words(kind):
    files = user_pages() + _tracked("configs/*", "sandbox/*", "docs/*.md") if kind == "pages" else _tracked("*.py")
    hits = []
    for f in sorted(set(files)):
        for i, line in enumerate(open(os.path.join(ROOT, f), errors="replace"), 1):
            if WORKSHOP.search(line) and not (f == "tests/test_docs.py"):
                hits.append("%s:%d %s" % (f, i, line.strip()[:120]))
    assert not hits, "\n".join(hits)


def test_every_results_section_names_a_command():
    """docs/results.md: each table row gives the command that reproduces its figure, or a test."""
    lines = open(os.path.join(ROOT, "docs", "results.md")).read().splitlines()
    header, missing = None, []
    for i, line in enumerate(lines, 1):
        if not line.startswith("| "):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif "command" in header and not line.startswith("|---"):
            command = cells[header.index("command")]
            if not re.search(r"`[^`]+`|in the file|same run|same|above", command):
                missing.append("docs/results.md:%d %s" % (i, line[:100]))
    assert not missing, "\n".join(missing)


COMMAND = re.compile(r"^    (\.venv/bin/|\./|python |mpirun |sbatch |squeue|docker|tmux |[A-Z_]+=\S+ )")
TESTED_BY = re.compile(r"not tested here|tests/(test_\w+\.py)")


def command_blocks(page):
    """(line number, the block's commands, the text that may label it: the paragraph before the
    block and the block's own comments) for each indented code block of commands."""
    lines = open(os.path.join(ROOT, page)).read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if COMMAND.match(lines[i]) and (i == 0 or not lines[i - 1].startswith("    ")):
            start, j = i, i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            before, k = [], start - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            while k >= 0 and lines[k].strip() and not lines[k].startswith("    "):
                before.insert(0, lines[k])
                k -= 1
            body = [x for x in lines[start:j] if x.strip()]
            blocks.append((start + 1, body, " ".join(before + body)))
            i = j
        else:
            i += 1
    return blocks


def test_every_command_shown_is_tested_or_says_it_is_not():
    """A command a page shows is run as written by the test it names (tests/test_x.py, beside it),
    or the page says it is not tested here; the README's own commands are tests/test_readme.py's."""
    from tests import test_readme
    readme = set(test_readme.HERE) | set(test_readme.ELSEWHERE)
    unlabelled = []
    for page in _tracked("docs/*.md", "sandbox/README.md"):
        for line, body, label in command_blocks(page):
            if all(re.sub(r"\s+#.*$", "", b.strip()) in readme for b in body):
                continue
            named = TESTED_BY.findall(label)
            missing = [t for t in named if t and not os.path.exists(os.path.join(ROOT, "tests", t))]
            if not TESTED_BY.search(label) or missing:
                unlabelled.append("%s:%d %s%s" % (page, line, body[0].strip()[:80],
                                                  " (no such test: %s)" % missing if missing else ""))
    assert not unlabelled, "\n".join(unlabelled)
