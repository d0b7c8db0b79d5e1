#!/usr/bin/env python3
"""The links of the documentation resolve, and none leaves the repository.

    tests/doc_links.py SOURCE_DIR

Checks README.md, docs/*.md, bench/README.md and bench/results/*.md: every
relative link names a file or folder of the repository, and a #fragment one
of the target's headings (GitHub's anchors: lower case, punctuation dropped,
spaces as '-', '-1', '-2' for repeats) or an <a id="..."> in it. Web links
are not fetched. Links in fenced code are not links. Exit 1 naming each file,
line and link that does not resolve.
"""
import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ANCHOR_TAG = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def slug(heading):
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen = set(), {}
        with open(path, encoding="utf-8") as f:
            for _, line in prose_lines(f.read()):
                m = HEADING.match(line)
                if m:
                    base = slug(m.group(2))
                    count = seen.get(base, 0)
                    seen[base] = count + 1
                    found.add(base if count == 0 else "%s-%d" % (base, count))
                found.update(ANCHOR_TAG.findall(line))
        cache[path] = found
    return cache[path]


def check_file(root, path, errors):
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if "../shared" in text:
        errors.append("%s: names ../shared, outside the repository" % rel)
    for n, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # a web link or mailto: not fetched
            where = "%s:%d: link %s" % (rel, n, target)
            file_part, _, fragment = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if os.path.commonpath([root, dest]) != root:
                errors.append(where + ": leaves the repository")
            elif not os.path.exists(dest):
                errors.append(where + ": no such file")
            elif fragment and dest.endswith(".md") and fragment not in anchors(dest):
                errors.append(where + ": no heading #%s in %s" % (fragment, os.path.relpath(dest, root)))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: doc_links.py SOURCE_DIR")
    root = os.path.realpath(sys.argv[1])
    files = [os.path.join(root, "README.md"), os.path.join(root, "bench", "README.md")]
    for folder in ("docs", os.path.join("bench", "results")):
        d = os.path.join(root, folder)
        if os.path.isdir(d):
            files += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".md"))
    errors = []
    for path in files:
        check_file(root, path, errors)
    for e in errors:
        print(e, file=sys.stderr)
    print("%d files, %d broken links" % (len(files), len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
