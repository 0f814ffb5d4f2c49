#!/usr/bin/env python3
"""Prints 'N passed, N failed' from a `bazel test` log and the test XML files.

Counts test cases (gtest cases from each target's test.xml); a target that
failed to build, timed out or left no XML counts as one failed case.
Usage: test_summary.py BAZEL_LOG TESTLOGS_DIR
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED|FLAKY|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE|SKIPPED)")


def main(log_path, testlogs):
    passed = failed = 0
    with open(log_path, encoding="utf-8", errors="replace") as log:
        for line in log:
            match = STATUS.match(line.strip())
            if not match:
                continue
            target, status = match.groups()
            package, name = target[2:].split(":")
            xml_path = os.path.join(testlogs, package, name, "test.xml")
            cases = failures = 0
            if status in ("PASSED", "FAILED", "FLAKY") and os.path.exists(xml_path):
                root = ET.parse(xml_path).getroot()
                suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
                for suite in suites:
                    cases += int(suite.get("tests", 0))
                    failures += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            if cases == 0:
                cases, failures = 1, 0 if status == "PASSED" else 1
            if status not in ("PASSED", "FLAKY") and failures == 0:
                failures = 1
            passed += cases - failures
            failed += failures
    print(f"{passed} passed, {failed} failed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
