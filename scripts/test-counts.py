#!/usr/bin/env python3
"""Counts what one ctest run executed, from its JUnit report (ctest --output-junit):
ctest entries, gtest unit cases (one entry each), and the cases inside the e2e entries
(a Python suite's "Ran N tests", skips included; a gtest binary's "[  PASSED  ] N").
scripts/test.sh prints this line for every stage so that a suite that silently stopped
running shows as a smaller number.
    scripts/test-counts.py REPORT.xml
"""
import re
import sys
import xml.etree.ElementTree as ET


def main(path):
    entries = failed = unit = e2e_cases = skipped = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        entries += 1
        status = case.get("status", "run")
        if status == "fail" or case.find("failure") is not None:
            failed += 1
        name = case.get("name", "")
        out = case.findtext("system-out") or ""
        if not name.startswith("e2e_"):
            unit += 1
            continue
        ran = re.findall(r"^Ran (\d+) tests? in", out, re.M)
        passed = re.findall(r"^\[  PASSED  \] (\d+) tests?", out, re.M)
        e2e_cases += sum(map(int, ran)) + sum(map(int, passed))
        skipped += sum(int(n) for n in re.findall(r"skipped=(\d+)", out))
    print(f"{entries} ctest entries ({failed} failed): {unit} unit cases, "
          f"{e2e_cases} e2e cases ({skipped} of them skipped)")


if __name__ == "__main__":
    main(sys.argv[1])
