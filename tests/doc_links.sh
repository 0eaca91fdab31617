#!/bin/sh
# Every relative link in the README and docs/ (and the example READMEs)
# names a file or folder that exists, so the guides cannot drift away from
# the tree. Links to the web and to anchors in the same page are not checked.
# Usage: tests/doc_links.sh REPO_ROOT
set -u
root=$1
checked=0 bad=0
for page in "$root/README.md" "$root"/docs/*.md "$root"/examples/*/README.md; do
  [ -f "$page" ] || continue
  dir=$(dirname "$page")
  # ](target) and ](target "title"), one per line
  for target in $(grep -o '\](\([^)# ]*\)' "$page" | sed 's/^](//'); do
    case "$target" in http://* | https://* | mailto:* | '') continue ;; esac
    checked=$((checked + 1))
    if [ ! -e "$dir/$target" ]; then
      echo "FAIL: $page links to $target, which does not exist"
      bad=1
    fi
  done
done
[ "$checked" -gt 0 ] || { echo "FAIL: no relative links found under $root: nothing was checked"; exit 1; }
[ "$bad" = 0 ] || exit 1
echo "ok: $checked relative links resolve"
