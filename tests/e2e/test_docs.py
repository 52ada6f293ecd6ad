# ctest: once
"""The documents agree with the binary: README's flag table lists exactly the flags
`--help` lists, with the same numeric defaults, and nothing in the repository's documents
points outside the repository (a user who clones it has nothing else). The comments and
docstrings of src/, include/, tests/, scripts/ and bench/ cite only documents of the
repository, and every repository path they name exists (these tests need no binary)."""

import ast
import io
import os
import re
import tokenize
import subprocess
import unittest

from metad_harness import server_args

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def help_entries():
    """flag → the text of its --help entry (its line and the continuation lines)."""
    binary = server_args()[0]
    text = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    entries, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^  (--[a-z-]+)", line)
        if m:
            current = m.group(1)
            entries[current] = line
        elif current and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def readme_rows():
    """flag → its default cell, for each row of README's flag table."""
    rows = {}
    with open(os.path.join(ROOT, "README.md")) as f:
        for line in f:
            if not line.startswith("| `--"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            for flag in re.findall(r"--[a-z-]+", cells[0]):
                rows[flag] = cells[1] if len(cells) > 1 else ""
    return rows


class FlagsTest(unittest.TestCase):

    def test_readme_lists_every_flag_of_help_and_no_other(self):
        self.assertEqual(sorted(readme_rows()), sorted(help_entries()))

    def test_numeric_defaults_agree(self):
        entries = help_entries()
        checked = 0
        for flag, default in readme_rows().items():
            m = re.fullmatch(r"`?(\d+)`?", default)
            if not m:
                continue
            with self.subTest(flag=flag):
                self.assertRegex(entries[flag], rf"\(default {m.group(1)}\b",
                                 f"README says {flag} defaults to {m.group(1)}")
                checked += 1
        self.assertGreater(checked, 15)


class SelfContainedTest(unittest.TestCase):

    def test_no_document_points_outside_the_repository(self):
        offenders = []
        for top in ("README.md", "docs", "deploy", "tests/README.md", "bench/RESULTS.md"):
            path = os.path.join(ROOT, top)
            files = [path] if os.path.isfile(path) else [
                os.path.join(d, n) for d, _, names in os.walk(path) for n in names
                if n.endswith((".md", ".txt", ".cfg", ".conf", ".yml", ".yaml", ".service",
                               ".default"))]
            for name in files:
                with open(name, errors="replace") as f:
                    lines = list(enumerate(f.read().split("\n"), 1))
                # The same rules as for comments (below): no outside document, and every
                # repository path named exists.
                offenders += bad_citations(os.path.relpath(name, ROOT), lines)
        self.assertEqual(offenders, [], "\n" + "\n".join(offenders))


# Documents that live outside the repository (the design notes and specs the project
# started from): a comment must cite the repository's own documents instead.
OUTSIDE_DOCUMENT = re.compile(
    r"design-ha"
    r"|(?<!docs/)\bdesign\.md"
    r"|\.\./shared|\bshared/(?:spec|design)"
    r"|(?<![\w/])spec/[\w.-]+\.md"
    r"|\bresearch/[\w.-]+\.md"
    r"|/work/")
# A path inside the repository, from one of its top-level directories to a file name
# with an extension. Not when it continues another path or a URL (preceded by a word
# character, '/', '.' or '-'), nor a pattern or template (followed by '*', '<', '{').
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:src|tests|docs|scripts|include|deploy|bench)/[\w./+-]*\.[A-Za-z0-9]+)"
    r"(?![\w/*<{-]|\.\w)")
# A path under src/ (or include/) named from its module, as includes are written:
# "pipeline/routes.hpp".
MODULE_PATH = re.compile(
    r"(?<![\w./-])((?:smp|http|api|shard|store|net|ha|repl|pipeline|persist|server|metad)"
    r"/[\w.-]+\.(?:hpp|cpp|h))(?![\w/*<{-]|\.\w)")
SOURCE_TOPS = ("src", "include", "tests", "scripts", "bench")
SOURCE_EXTENSIONS = (".cpp", ".hpp", ".h", ".py", ".sh", ".txt", ".cmake", ".dict", ".md")


def source_files():
    """Every file of SOURCE_TOPS that holds comments, relative to ROOT."""
    for top in SOURCE_TOPS:
        for directory, dirs, names in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for name in sorted(names):
                if name.endswith(SOURCE_EXTENSIONS):
                    yield os.path.relpath(os.path.join(directory, name), ROOT)


def cpp_comments(text):
    """(line, text) of each // and /* */ comment, outside string and character literals
    (raw strings included)."""
    out, i, line, n = [], 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append((line, text[i + 2:end]))
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end
            for k, part in enumerate(text[i + 2:end].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, end)
            i = end + 2
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum()
                                                           or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delimiter = text[i + 2:open_paren]
            end = text.find(")" + delimiter + '"', open_paren)
            end = n if end < 0 else end + len(delimiter) + 2
            line += text.count("\n", i, end)
            i = end
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def python_comments(text):
    """(line, text) of each # comment and each line of each docstring."""
    out = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            out.append((token.start[0], token.string[1:]))
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                first = body[0].value.lineno
                for k, part in enumerate(body[0].value.value.split("\n")):
                    out.append((first + k, part))
    return out


def hash_comments(text):
    """(line, text) of each # comment of a shell script, CMake file or dictionary: from
    a '#' at the start of a line or after a blank (not $# or ${#x})."""
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        if number == 1 and line.startswith("#!"):
            continue
        m = re.search(r"(?:^|\s)#(.*)$", line)
        if m:
            out.append((number, m.group(1)))
    return out


def comments(path):
    """(line, text) of what a reader of `path` reads as prose: its comments and
    docstrings, or all of it for a Markdown file."""
    with open(os.path.join(ROOT, path), errors="replace") as f:
        text = f.read()
    if path.endswith((".cpp", ".hpp", ".h")):
        return cpp_comments(text)
    if path.endswith(".py"):
        return python_comments(text)
    if path.endswith(".md"):
        return list(enumerate(text.split("\n"), 1))
    return hash_comments(text)


def bad_citations(path, entries):
    """'path:line: why' for each citation of `entries` (a file's comments) that points
    outside the repository or names a repository path that does not exist."""
    bad = []
    for number, text in entries:
        m = OUTSIDE_DOCUMENT.search(text)
        if m:
            bad.append(f"{path}:{number}: cites {m.group(0)!r}, outside the repository: "
                       f"{text.strip()}")
        for m in REPO_PATH.finditer(text):
            if not os.path.exists(os.path.join(ROOT, m.group(1))):
                bad.append(f"{path}:{number}: names {m.group(1)}, which does not exist")
        for m in MODULE_PATH.finditer(text):
            name = m.group(1)
            if not any(os.path.exists(os.path.join(ROOT, top, name)) for top in ("src", "include")):
                bad.append(f"{path}:{number}: names {name}, which is in neither src/ nor include/")
    return bad


class SourceCitationsTest(unittest.TestCase):

    def test_comments_cite_only_the_repository(self):
        offenders = []
        for path in source_files():
            offenders += bad_citations(path, comments(path))
        self.assertEqual(offenders, [], "\n" + "\n".join(offenders))

    def test_the_check_finds_a_bad_citation(self):
        # The checker itself, on comments written here: each bad one is found, good ones
        # pass (so that the test above cannot pass by finding nothing).
        self.assertGreater(len(list(source_files())), 100)
        bad = [
            "see design-" + "ha.md section 4",
            "(" + "design" + ".md)",
            "the spec, ../" + "shared/" + "spec/api.md",
            "every bad shape of " + "spec/api.md",
            "the replayer (src/server/durability.cpp)",
            "see tests/e2e/test_nothing_here.py.",
            "docs/nothing-here.md, Section",
            "belongs to server/routes.hpp",
        ]
        good = [
            "see docs/replication.md, \"The sync set\"",
            "the replayer (src/persist/replayer.cpp).",
            "pipeline/routes.hpp and metad/server.hpp",
            "https://github.com/vllm-project/vllm/blob/main/src/x/y.py",
            "build/views/src/missing.hpp and g<G>/core-<c>.log-<S> and tests/e2e/test_*.py",
        ]
        for text in bad:
            with self.subTest(bad=text):
                self.assertTrue(bad_citations("x", [(1, text)]))
        for text in good:
            with self.subTest(good=text):
                self.assertEqual(bad_citations("x", [(1, text)]), [])
        code = 'const char* url = "http://x/design-" "ha.md"; // a real comment\n' \
               "auto n = 1'000; /* src/persist/standby.hpp */ auto r = R\"(// not one)\";\n"
        self.assertEqual(cpp_comments(code),
                         [(1, " a real comment"), (2, " src/persist/standby.hpp ")])
        self.assertEqual([t for _, t in python_comments('"""Doc."""\nx = "# no"  # yes\n')],
                         [" yes", "Doc."])


if __name__ == "__main__":
    unittest.main()
