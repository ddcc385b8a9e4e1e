#!/usr/bin/env bash
# tools/check_section_refs.sh — checks that every section reference in the
# tracked sources and docs names a section of kernels/ALGORITHMS.md.
#
# Run from the repository root:  bash tools/check_section_refs.sh
#
# A reference is the section sign followed by a section number, with or
# without a space between them: "<sign>2.3", "<sign> 2.3", "<sign>5.1 last
# bullet" (only the number counts). A doubled sign introduces a range,
# "<sign><sign>2-7" (hyphen, en dash or em dash), and both ends are checked.
# The sign is written as an escape below so that this script holds no
# reference itself.
#
# Files: `git ls-files` of *.h *.cuh *.cpp *.cu *.sh *.py *.md and Makefile,
# except kernels/ALGORITHMS.md. Sections: the numbers of its headings
# "## 2. Title" and "### 2.1 Title" (number first).
#
# Prints "file:line: <sign>X.Y: no such section in kernels/ALGORITHMS.md" for
# each unresolved reference and exits 1 if there is any; otherwise prints
# "section references: N checked, all resolve" and exits 0.
set -eu
export LC_ALL=C  # byte-wise matching; the sign and dashes are UTF-8 byte sequences

doc=kernels/ALGORITHMS.md
if [ ! -f "$doc" ]; then
    echo "tools/check_section_refs.sh: $doc not found (run from the repository root)" >&2
    exit 2
fi

sign=$'\xc2\xa7'                          # U+00A7
dash=$'(-|\xe2\x80\x93|\xe2\x80\x94)'     # hyphen, U+2013, U+2014
num='[0-9]+(\.[0-9]+)*'
pattern="${sign}(${sign})?[[:space:]]*${num}([[:space:]]*${dash}[[:space:]]*(${sign})?${num})?"

# the section numbers of the headings, one per line
sections=$(sed -nE 's/^#{1,6}[[:space:]]+([0-9]+(\.[0-9]+)*)\.?[[:space:]].*/\1/p' "$doc")

# every reference as "file<TAB>line<TAB>match"
refs=$(git ls-files -z -- '*.h' '*.cuh' '*.cpp' '*.cu' '*.sh' '*.py' '*.md' 'Makefile' '*/Makefile' |
    while IFS= read -r -d '' file; do
        [ "$file" = "$doc" ] && continue
        [ -f "$file" ] || continue
        grep -noE -- "$pattern" "$file" |
            FILE="$file" awk '{ i = index($0, ":"); printf "%s\t%s\t%s\n", ENVIRON["FILE"], substr($0, 1, i - 1), substr($0, i + 1) }' || true
    done)

printf '%s\n' "$refs" | SECTIONS="$sections" awk -F '\t' -v sign="$sign" -v en=$'\xe2\x80\x93' \
    -v em=$'\xe2\x80\x94' -v doc="$doc" '
BEGIN {
    n = split(ENVIRON["SECTIONS"], list, "\n")
    for (i = 1; i <= n; i++) if (list[i] != "") known[list[i]] = 1
    checked = 0; bad = 0
}
NF >= 3 {
    ref = $3
    gsub(sign, " ", ref)                      # drop the signs
    gsub(en, "-", ref); gsub(em, "-", ref)    # dashes to hyphens
    gsub(/[[:space:]]/, "", ref)
    m = split(ref, ends, "-")
    for (e = 1; e <= m; e++) {
        if (ends[e] == "") continue
        checked++
        if (!(ends[e] in known)) {
            printf "%s:%s: %s%s: no such section in %s\n", $1, $2, sign, ends[e], doc
            bad++
        }
    }
}
END {
    if (bad > 0) exit 1
    printf "section references: %d checked, all resolve\n", checked
}'
