"""Mira's query corpora checked against Grafana's own grammars: every line
of tests/fixtures/<language>-valid.txt must parse with Grafana's lezer
parser for the language, and no line of <language>-invalid.txt may (Mira's
parsers read the same files in their unit tests, so each corpus is what
both agree on). Runs tests/grammar/check.mjs under node; the grammars
come from `npm ci --prefix tests/grammar`, which .ci/run does."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GRAMMAR_DIR = os.path.join(ROOT, "tests", "grammar")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

# One entry per language with a corpus; check.mjs knows its grammar package.
LANGUAGES = ["logql", "traceql"]


@pytest.mark.parametrize("language", LANGUAGES)
def test_corpus_agrees_with_grafanas_grammar(language):
    node = shutil.which("node")
    assert node, "node is not installed (.ci/run installs Debian's nodejs and npm)"
    package = os.path.join(GRAMMAR_DIR, "node_modules", "@grafana", f"lezer-{language}")
    assert os.path.isdir(package), "the grammars are not installed: run npm ci --prefix tests/grammar"
    valid = os.path.join(FIXTURES, f"{language}-valid.txt")
    invalid = os.path.join(FIXTURES, f"{language}-invalid.txt")
    result = subprocess.run(
        [node, os.path.join(GRAMMAR_DIR, "check.mjs"), language, valid, invalid],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert ", 0 disagreements" in result.stdout, result.stdout
