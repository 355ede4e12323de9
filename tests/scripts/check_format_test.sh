#!/usr/bin/env bash
# scripts/check_format.sh on clones of this repository with one badly
# formatted C++ file committed on top: a full clone and a depth-2 shallow
# clone find it (exit 1, the file named); a depth-1 shallow clone has no
# parent to compare with and checks nothing (exit 0, saying so), as the
# script documents, instead of failing for want of history.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q "$root" "$tmp/full"
cp "$root/scripts/check_format.sh" "$tmp/full/scripts/check_format.sh"  # the one under test
cp "$root/.clang-format" "$tmp/full/.clang-format"
printf 'int  badly_formatted( ){return 0;}\n' > "$tmp/full/base/format_probe.cc"
git -C "$tmp/full" add -A scripts/check_format.sh .clang-format base/format_probe.cc
git -C "$tmp/full" -c user.name=test -c user.email=test@example.com commit -q -m probe

expect_bad() {  # $1: clone
  local out rc=0
  out=$(cd "$1" && bash scripts/check_format.sh 2>&1) || rc=$?
  if ((rc != 1)) || [[ $out != *base/format_probe.cc* ]]; then
    printf '%s: expected exit 1 naming base/format_probe.cc, got %d:\n%s\n' "$1" "$rc" "$out" >&2
    exit 1
  fi
}
expect_bad "$tmp/full"
git clone -q --depth 2 "file://$tmp/full" "$tmp/shallow2"
expect_bad "$tmp/shallow2"
git clone -q --depth 1 "file://$tmp/full" "$tmp/shallow1"
out=$(cd "$tmp/shallow1" && bash scripts/check_format.sh 2>&1) || {
  printf 'depth 1: expected exit 0, got %d:\n%s\n' "$?" "$out" >&2
  exit 1
}
[[ $out == "check_format: no C++ files changed since "* ]] || {
  printf 'depth 1: expected "no C++ files changed", got:\n%s\n' "$out" >&2
  exit 1
}
echo "check_format.sh: ok (full and depth-2 clones find the file; depth 1 checks nothing)"
