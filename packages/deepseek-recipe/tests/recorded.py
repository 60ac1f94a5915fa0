"""The recorded official outputs that the conformance tests replay (tests/fixtures/*.jsonl)."""

import collections
import json
import pathlib
import sys

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def load_cases(name):
    """The records of tests/fixtures/<name>, one JSON object a line."""
    with open(FIXTURES / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def case_ids(records):
    """Test ids: each record's case id."""
    return [r["case"]["id"] for r in records]


def report(records, actual, width=12):
    """Prints a pass count per case family (the first part of the case id) and in total, for running a
    conformance test directly: a case passes when `actual(record)` equals its recorded result; `-v` on
    the command line lists the failing case ids."""
    passed = collections.Counter()
    total = collections.Counter()
    failures = []
    for record in records:
        family = record["case"]["id"].split("/")[0]
        total[family] += 1
        if actual(record) == record["expected"]:
            passed[family] += 1
        else:
            failures.append(record["case"]["id"])
    for family in sorted(total):
        print(f"{family:{width}s} {passed[family]:4d}/{total[family]}")
    print(f"TOTAL {sum(passed.values())}/{sum(total.values())}")
    if "-v" in sys.argv:
        print("\n".join(failures))
