"""The README's code snippets are excerpts of the examples that CI builds and
runs: every snippet whose first line names a file under examples/ must
consist of that file's lines, in order ("..." marks what is left out)."""
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMMENT = re.compile(r"^(?://|#|/\*)\s*(examples/\S+)\s*\(excerpt\)")


def snippets():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    for block in re.findall(r"^```[a-z+]*\n(.*?)^```", text, re.M | re.S):
        lines = block.splitlines()
        m = COMMENT.match(lines[0]) if lines else None
        if m:
            yield m.group(1), lines[1:]


def test_every_language_has_an_example_snippet():
    assert sorted(os.path.splitext(p)[1] for p, _ in snippets()) == [".c", ".cpp", ".py", ".rs"]


def test_readme_snippets_are_excerpts_of_the_examples():
    for path, lines in snippets():
        with open(os.path.join(ROOT, path)) as f:
            source = [line.strip() for line in f]
        at = 0
        for line in (l.strip() for l in lines):
            if not line or line == "...":
                continue
            try:
                at = source.index(line, at) + 1
            except ValueError:
                raise AssertionError(f"README snippet of {path}: {line!r} is not in the file "
                                     f"(after line {at})") from None
