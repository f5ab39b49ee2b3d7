#!/usr/bin/env python3
"""JUnit XML for the rogue stage (tests/rogue/run.sh).

  junit.py --tally FILE...       count every <testcase> of the files (pytest's,
                                 ctest's, the consumer's and the VM's): print
                                 each failure, then `rogue: N passed, M failed
                                 [, K skipped]`; exit 1 when M > 0 (a file
                                 that does not parse counts as a failure; in
                                 vm-*.xml, the rxe VM's, a skip is a failure)
  junit.py --fail|--skip|--pass NAME [MESSAGE]
                                 print one testsuite with one test case NAME
                                 in that state (for steps that are not pytest)
"""
import os
import sys
import xml.etree.ElementTree as ET
from xml.sax.saxutils import quoteattr


def one(state: str, name: str, message: str = "") -> str:
    body = {"pass": "", "fail": f"<failure message={quoteattr(message or name)}/>",
            "skip": f"<skipped message={quoteattr(message or name)}/>"}[state]
    return (f'<testsuite name="rogue" tests="1"><testcase classname="rogue" name={quoteattr(name)}>'
            f"{body}</testcase></testsuite>\n")


def tally(paths):
    passed, failed, skipped, failures = 0, 0, 0, []
    for path in paths:
        try:
            cases = list(ET.parse(path).getroot().iter("testcase"))
        except (OSError, ET.ParseError) as e:
            failed += 1
            failures.append(f"{path}: no results ({e})")
            continue
        if not cases:
            failed += 1
            failures.append(f"{path}: no test ran")
        for c in cases:
            name = f"{c.get('classname', '')}::{c.get('name')}"
            bad = c.find("failure") is not None or c.find("error") is not None or c.get("status") == "fail"
            if bad:
                failed += 1
                el = c.find("failure") if c.find("failure") is not None else c.find("error")
                failures.append(f"{name}: {el.get('message', '') if el is not None else 'failed'}"[:300])
            elif c.find("skipped") is not None or c.get("status") in ("notrun", "disabled"):
                if os.path.basename(path).startswith("vm-"):  # in the VM nothing may skip
                    failed += 1
                    failures.append(f"{name}: skipped in the rxe VM, where it must run")
                else:
                    skipped += 1
            else:
                passed += 1
    for f in failures:
        print(f"rogue: FAILED {f}")
    tail = f", {skipped} skipped" if skipped else ""
    print(f"rogue: {passed} passed, {failed} failed{tail}")
    return 1 if failed else 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "--tally":
        return tally(argv[1:])
    if len(argv) in (2, 3) and argv[0] in ("--fail", "--skip", "--pass"):
        sys.stdout.write(one(argv[0][2:], argv[1], argv[2] if len(argv) == 3 else ""))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
