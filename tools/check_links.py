#!/usr/bin/env python3
"""tools/check_links.py — checks that every relative link in the repository's Markdown
files resolves: the file or folder it names exists, and its #anchor (if any) is a heading
of the Markdown file it points to, as GitHub names headings.

Run from the repository root:  python3 tools/check_links.py

Files: the *.md files git tracks, and those not yet tracked that it does not ignore.
Links: [text](target) and ![alt](target) outside code blocks and inline code, and
<a href="target">; targets with a scheme (https:, mailto:) are not checked. An anchor is
GitHub's: the heading's text without its Markdown markup, lower-cased, every character
that is not a letter, digit, space, hyphen or underscore dropped, spaces turned into
hyphens, and -1, -2, ... added to repeats.

Prints "file:line: target: why" for each broken link and exits 1 if there is any;
otherwise prints "markdown links: N checked in M files, all resolve" and exits 0.
"""
import os
import re
import subprocess
import sys

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HREF = re.compile(r"<a\s[^>]*href=\"([^\"]+)\"")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files():
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.md"],
                         capture_output=True, check=True).stdout.decode()
    return sorted({f for f in out.split("\0") if f and os.path.isfile(f)})


def lines_outside_code(path):
    """(line number, text with inline code blanked) of the lines outside fenced code blocks."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield number, re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line)


def slug(heading):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)                         # inline HTML
    text = text.replace("`", "").strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


anchor_cache = {}


def anchors(path):
    if path not in anchor_cache:
        seen, names = {}, set()
        fenced = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                m = None if fenced else HEADING.match(line)
                if not m:
                    continue
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                names.add(base if n == 0 else f"{base}-{n}")
        anchor_cache[path] = names
    return anchor_cache[path]


def check(path, number, target):
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return None  # https:, mailto:, ...
    file_part, _, anchor = target.partition("#")
    resolved = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
    if not os.path.exists(resolved):
        return f"{resolved} does not exist"
    if anchor:
        if not resolved.endswith(".md") or os.path.isdir(resolved):
            return f"an anchor into {resolved}, which is not a Markdown file"
        if anchor not in anchors(resolved):
            return f"no heading of {resolved} has the anchor #{anchor}"
    return None


def main():
    if not os.path.isdir(".git") and subprocess.run(["git", "rev-parse"], capture_output=True).returncode != 0:
        print("tools/check_links.py: run it from the repository root", file=sys.stderr)
        return 2
    files = markdown_files()
    checked, broken = 0, 0
    for path in files:
        for number, line in lines_outside_code(path):
            for target in LINK.findall(line) + HREF.findall(line):
                checked += 1
                why = check(path, number, target)
                if why:
                    broken += 1
                    print(f"{path}:{number}: {target}: {why}")
    if broken:
        print(f"markdown links: {broken} of {checked} do not resolve")
        return 1
    print(f"markdown links: {checked} checked in {len(files)} files, all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
