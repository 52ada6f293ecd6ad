# ctest: once
"""The documents agree with the binary: README's flag table lists exactly the flags
`--help` lists, with the same numeric defaults, and nothing in the repository's documents
points outside the repository (a user who clones it has nothing else)."""

import os
import re
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
                if n.endswith((".md", ".txt", ".cfg", ".conf", ".yml", ".yaml", ".service"))]
            for name in files:
                with open(name, errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        if "../shared" in line or "shared/spec" in line or "shared/design" in line:
                            offenders.append(f"{os.path.relpath(name, ROOT)}:{number}: {line.strip()}")
        self.assertEqual(offenders, [])


if __name__ == "__main__":
    unittest.main()
