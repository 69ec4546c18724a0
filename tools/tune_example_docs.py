#!/usr/bin/env python3
"""docs/tune.md's worked example is the output of docs/examples/tune_example.sh.

Usage: tools/tune_example_docs.py BUILD_DIR [--write]

Runs the script on BUILD_DIR's strata-tune and strata-bench and sets its transcript against the
block of docs/tune.md between the BEGIN and END markers below: exit 0 when they are equal, 1 with
a unified diff when not (ctest tune_example_docs), 2 on bad usage. With --write the block is
replaced by the transcript instead.
"""
import difflib
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "tune.md")
SCRIPT = os.path.join(ROOT, "docs", "examples", "tune_example.sh")
BEGIN = "<!-- BEGIN docs/examples/tune_example.sh output (tools/tune_example_docs.py --write; ctest tune_example_docs checks it) -->"
END = "<!-- END docs/examples/tune_example.sh output -->"


def main(argv):
    args = [a for a in argv[1:] if a != "--write"]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    run = subprocess.run(["bash", SCRIPT, args[0]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode != 0:
        print(f"{SCRIPT} failed (exit {run.returncode}):\n{run.stdout}", file=sys.stderr)
        return 1
    block = "```\n" + run.stdout.rstrip("\n") + "\n```\n"
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    start, stop = doc.find(BEGIN), doc.find(END)
    if start < 0 or stop < start:
        print(f"{DOC}: no '{BEGIN}' ... '{END}' block", file=sys.stderr)
        return 1
    start += len(BEGIN) + 1
    if "--write" in argv:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(doc[:start] + block + doc[stop:])
        print(f"wrote the example into {DOC}")
        return 0
    if doc[start:stop] == block:
        return 0
    diff = difflib.unified_diff(doc[start:stop].splitlines(True), block.splitlines(True), "docs/tune.md",
                                "docs/examples/tune_example.sh")
    sys.stdout.writelines(diff)
    print("docs/tune.md's worked example differs from what docs/examples/tune_example.sh prints: run "
          "tools/tune_example_docs.py BUILD_DIR --write and commit docs/tune.md", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
