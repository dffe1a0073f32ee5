"""Product files describe the product as it is now: no work-log markers, documents within their
size limits, and every benchmark script listed in BENCHMARKS.md.

History (dated) belongs in CHANGELOG.md and docs/history/; these checks keep it there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: words of a work log: numbered work periods, numbered helpers and reviews, and old commands
#: quoted with how they were run back then
MARKERS = [
    re.compile(r"\bsessions?\s+\d+", re.IGNORECASE),
    re.compile(r"\bhelper-\d+", re.IGNORECASE),
    re.compile(r"\breview(?:er)?\s+\d+", re.IGNORECASE),
    re.compile(r"\bas (?:it|they) ran(?: then)?\b", re.IGNORECASE),
]

SCRIPT_SUFFIXES = (".py", ".sh")


def product_files() -> list[Path]:
    files = [ROOT / n for n in ("README.md", "MODEL_CARD.md", "BENCHMARKS.md", "RELIABILITY.md")]
    files += sorted((ROOT / "docs").glob("*.md"))  # docs/history/ is the record, not product
    files += sorted((ROOT / "collapseguard").rglob("*.py"))
    files += sorted((ROOT / "tests").rglob("*.py"))
    for folder in ("benchmarks", "recipes"):
        files += sorted(p for p in (ROOT / folder).glob("*") if p.is_file())
    return [p for p in files if p.is_file() and "__pycache__" not in p.parts]


def test_the_checked_files_include_each_kind():
    names = {p.relative_to(ROOT).as_posix() for p in product_files()}
    assert {"README.md", "MODEL_CARD.md", "BENCHMARKS.md"} <= names
    assert any(n.startswith("collapseguard/") for n in names)
    assert any(n.startswith("benchmarks/") for n in names)
    assert any(n.startswith("recipes/") for n in names)
    assert not any(n.startswith("docs/history/") for n in names)


@pytest.mark.parametrize("pattern", MARKERS, ids=lambda p: p.pattern)
def test_markers_are_caught(pattern):
    """Each pattern finds what it is for (a pattern that matches nothing would pass every file)."""
    # spelled in pieces, so that this file does not carry the markers it looks for
    samples = {
        MARKERS[0].pattern: "measured in session" + " 11", MARKERS[1].pattern: "found by helper-" + "19",
        MARKERS[2].pattern: "from review" + " 3", MARKERS[3].pattern: "to run it as " + "it ran then",
    }
    assert pattern.search(samples[pattern.pattern])
    assert not pattern.search("the session's lock; a reviewed path; a helper function; it ran")


def test_no_work_log_markers_in_product_files():
    hits = []
    for path in product_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for i, line in enumerate(text.splitlines(), 1):
            for pat in MARKERS:
                m = pat.search(line)
                if m:
                    hits.append(f"{path.relative_to(ROOT)}:{i}: {m.group(0)!r}")
    assert not hits, "work-log markers (history goes to CHANGELOG.md or docs/history/):\n" + "\n".join(hits)


def test_document_sizes():
    assert len((ROOT / "MODEL_CARD.md").read_text(encoding="utf-8")) < 16_000
    assert len((ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")) < 20_000


def test_benchmarks_are_few_and_each_is_listed():
    scripts = sorted(p.name for p in (ROOT / "benchmarks").iterdir()
                     if p.is_file() and p.suffix in SCRIPT_SUFFIXES)
    assert 0 < len(scripts) <= 14, scripts
    listed = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    missing = [s for s in scripts if f"`{s}`" not in listed and f"benchmarks/{s}" not in listed]
    assert not missing, f"benchmarks/ scripts not listed in BENCHMARKS.md: {missing}"


def test_ci_runs_the_readme_install_and_test_commands():
    """The README's install and test commands are the two that `.ci/run` runs, as it says."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    said = readme.index("`.ci/run` runs these two commands")
    block = readme[readme.index("```bash", said) + len("```bash"): readme.index("```", readme.index("```bash", said) + 7)]
    commands = [line.strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 2, commands
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert [c for c in ci if c in commands] == commands, (commands, ci)
