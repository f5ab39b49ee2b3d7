#!/usr/bin/env python3
"""docs/rogue.md's stage blocks as one bash script (tests/rogue/run.sh runs
it, so the page's commands are run as written):

  <!-- stage: run -->          the next fenced block, verbatim
  <!-- stage: file NAME -->    the next fenced block, written to NAME

Usage: doc_blocks.py docs/rogue.md > steps.sh   (exit 1 when a marker has
no block after it, or the page has no marker)."""
import re
import sys


def blocks(text):
    lines = text.splitlines()
    i, out = 0, []
    while i < len(lines):
        m = re.match(r"<!-- stage: (run|file (\S+)) -->\s*$", lines[i])
        i += 1
        if not m:
            continue
        while i < len(lines) and not lines[i].strip():
            i += 1
        if i >= len(lines) or not lines[i].startswith("```"):
            raise SystemExit(f"line {i}: a stage marker without a fenced block after it")
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        out.append((m.group(2), lines[i + 1:j], i + 2))
        i = j + 1
    if not out:
        raise SystemExit("no stage blocks")
    return out


def main():
    path = sys.argv[1]
    print("# generated from", path, "by tests/rogue/doc_blocks.py")
    for name, body, line in blocks(open(path).read()):
        print(f"echo '+ {path}:{line}' >&2")
        if name:
            print(f"cat > {name} <<'ROCEV2_DOC_EOF'")
            print("\n".join(body))
            print("ROCEV2_DOC_EOF")
        else:
            print("\n".join(body))


if __name__ == "__main__":
    main()
