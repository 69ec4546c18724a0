#!/usr/bin/env python3
"""Every repository path that README.md and docs/*.md name exists in the source tree.

usage: tools/docs_paths.py [--root DIR] [--verbose]
The ctest `docs_paths` (tests/CMakeLists.txt) runs it. Exit 0 when every mention exists, 1 (with one
line per missing path: FILE:LINE: `mention` ...) otherwise; --verbose also lists what was skipped.

What counts as a mention:
- inside a code span (`...`, which may wrap onto the next line of its paragraph), every word;
- the target of a Markdown link, [text](target) or [label]: target, resolved against the folder of
  the file that holds it (as a Markdown viewer does);
- in the prose, a word with a slash that ends in a known extension (.hpp, .md, ...) or a slash
  (`see toolkit/gather_probe.hpp`, `in store/detail/`); other prose words with a slash are skipped:
  "host/device" is not a path.
A word is a repository path when its first component is a top-level folder of the repository and it
has a slash (`store/io/file_io.hpp`, `bench/peers/`, `.ci/run`); it exists when the file or
folder is in the source tree (tracked by git or new and not ignored; with no git, on disk). A word
with a glob (`bench/profiles/*.json`) must match at least one such file.

What is skipped, and why:
- fenced code blocks (```): command lines and sample output, which name files the commands write
  (`--out plan.json`) and paths of the machine the output came from;
- words that do not start with a top-level folder: bare file names (`kernels.cpp` is relative to the
  folder the text is about), C++ names (`cache::CachePlanner`), test filters (`Seeds/ModeEquivalence.*`),
  absolute paths (`/proc/meminfo`) and paths outside the repository (`../shared/STYLE.md`);
- `build/...`: build outputs (`build/default/bench/strata-bench`), made by the build, not in the tree;
- templates: words with `<`, `>`, `{`, `}`, `$`, `|` or `...` (`results/bench-<time>/`,
  `results/<YYYY-MM-DD>-<topic>/`), which stand for paths that do not exist yet;
- link targets with a scheme (`https:`, `mailto:`) or only an anchor (`#layout`); an anchor after a
  path (`docs/bench.md#gather-limit`) is dropped and the path checked.
"""
import argparse
import fnmatch
import os
import re
import subprocess
import sys

TEMPLATE_MARKS = ("<", ">", "{", "}", "$", "|", "...")
GLOB_MARKS = ("*", "?", "[")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
INLINE_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
# A word of the prose with a slash, not inside a longer word or path.
PROSE_PATH = re.compile(r"(?<![\w./-])([.\w-]+/[\w./*<>-]*)")
KNOWN_EXTENSIONS = (".md", ".cpp", ".hpp", ".cu", ".cuh", ".py", ".sh", ".json", ".txt", ".cmake", ".in", ".supp", ".pc")
# Punctuation around a word in prose or in a command line: `(store/x.hpp,` or `--out=results/x`.
STRIP = "()[],;:\"'"


def source_files(root):
    """The files of the source tree relative to root, or None without git."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files = set(p for p in out.decode("utf-8", "replace").split("\0") if p)
    return set(p for p in files if os.path.lexists(os.path.join(root, p)))  # not deleted in the work tree


class Tree:
    def __init__(self, root):
        self.root = root
        self.files = source_files(root)
        if self.files is not None:
            self.dirs = set()
            for f in self.files:
                parts = f.split("/")
                for i in range(1, len(parts)):
                    self.dirs.add("/".join(parts[:i]))
            self.top = set(f.split("/")[0] for f in self.files if "/" in f)
        else:
            self.top = set(e for e in os.listdir(root)
                           if os.path.isdir(os.path.join(root, e)) and not e.startswith(".") and e != "build")

    def exists(self, rel):
        rel = rel.rstrip("/")
        if any(m in rel for m in GLOB_MARKS):
            if self.files is None:
                import glob
                return bool(glob.glob(os.path.join(self.root, rel)))
            return any(fnmatch.fnmatchcase(f, rel) for f in self.files)
        if self.files is None:
            return os.path.exists(os.path.join(self.root, rel))
        return rel in self.files or rel in self.dirs


def without_fences(text):
    """The text with every fenced block blanked (line numbers kept)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def mentions(text):
    """(line, word, kind) for every word of a code span ("code"), link target ("link") and path-like
    word of the prose ("prose"), outside fenced blocks."""
    text = without_fences(text)
    prose = text
    for m in CODE_SPAN.finditer(text):
        if "\n\n" in m.group(2):  # an unmatched backtick: a code span never crosses a paragraph
            continue
        prose = prose[:m.start()] + " " * (m.end() - m.start()) + prose[m.end():]
        line = text.count("\n", 0, m.start()) + 1
        for word in re.split(r"\s+|=", m.group(2)):
            yield line, word, "code"
    for pattern in (INLINE_LINK, REFERENCE_LINK):
        for m in pattern.finditer(prose):
            prose = prose[:m.start()] + " " * (m.end() - m.start()) + prose[m.end():]
            yield text.count("\n", 0, m.start()) + 1, m.group(1), "link"
    for m in PROSE_PATH.finditer(prose):
        word = m.group(1).rstrip(".,;:")
        if word.endswith("/") or word.endswith(KNOWN_EXTENSIONS):
            yield text.count("\n", 0, m.start()) + 1, word, "prose"


def check(root, md, tree, verbose):
    """Missing mentions of one Markdown file, as printable lines; prints skips when verbose."""
    missing, checked = [], 0
    rel_md = os.path.relpath(md, root)
    with open(md, encoding="utf-8") as f:
        text = f.read()
    for line, word, kind in mentions(text):
        is_link = kind == "link"
        where = f"{rel_md}:{line}"
        word = word.strip(STRIP).rstrip(".")
        reason = None
        if is_link:
            if re.match(r"^[a-z][a-z0-9+.-]*:", word) or word.startswith("#"):
                reason = "a URL or an anchor"
            else:
                word = os.path.normpath(os.path.join(os.path.dirname(rel_md), word.split("#")[0])).replace(os.sep, "/")
                if word.startswith(".."):
                    reason = "outside the repository"
        elif "/" not in word or word.split("/")[0] not in tree.top | {"build"}:
            continue  # not a repository path (see the list above); too common to list
        if reason is None and word.split("/")[0] == "build":
            reason = "a build output"
        elif reason is None and any(m in word for m in TEMPLATE_MARKS):
            reason = "a template"
        if reason:
            if verbose:
                print(f"{where}: skipped `{word}`: {reason}")
            continue
        checked += 1
        if not tree.exists(word):
            missing.append(f"{where}: `{word}` does not exist in the source tree")
    return missing, checked


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--verbose", action="store_true", help="also list the mentions skipped and why")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    tree = Tree(root)
    docs = [os.path.join(root, "README.md")]
    docs_dir = os.path.join(root, "docs")
    if os.path.isdir(docs_dir):
        docs += sorted(os.path.join(docs_dir, f) for f in os.listdir(docs_dir) if f.endswith(".md"))
    missing, checked = [], 0
    for md in docs:
        if os.path.exists(md):
            m, c = check(root, md, tree, args.verbose)
            missing += m
            checked += c
    for line in missing:
        print(line)
    names = ", ".join(os.path.relpath(d, root) for d in docs)
    if missing:
        print(f"docs_paths: {len(missing)} of {checked} path mentions in {names} do not exist")
        return 1
    print(f"docs_paths: all {checked} path mentions in {names} exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
