#!/usr/bin/env python3
"""Counts what one ctest run executed, from its JUnit report (ctest --output-junit):
ctest entries, the gtest cases inside the unit binaries and the C++ e2e binary
("[  PASSED  ] N tests", "[  SKIPPED ] N tests"), and the Python e2e cases ("Ran N tests",
"skipped=N"). scripts/test.sh prints this line for every stage so that a suite that
silently stopped running shows as a smaller number.
    scripts/test-counts.py REPORT.xml
"""
import re
import sys
import xml.etree.ElementTree as ET


def count(pattern, text):
    return sum(int(n) for n in re.findall(pattern, text, re.M))


def main(path):
    entries = failed = unit = e2e = skipped = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        entries += 1
        if case.get("status") == "fail" or case.find("failure") is not None:
            failed += 1
        out = case.findtext("system-out") or ""
        gtest = count(r"^\[  PASSED  \] (\d+) tests?", out) + count(r"^\[  FAILED  \] (\d+) tests?,", out)
        python = count(r"^Ran (\d+) tests? in", out)
        skipped += count(r"^\[  SKIPPED \] (\d+) tests?", out) + count(r"skipped=(\d+)", out)
        if case.get("name", "").startswith("e2e_"):
            e2e += gtest + python
        else:
            unit += gtest
    print(f"{entries} ctest entries ({failed} failed): {unit} unit cases, {e2e} e2e cases, "
          f"{skipped} of them skipped")


if __name__ == "__main__":
    main(sys.argv[1])
