#!/usr/bin/env bash
# Checks that the C++ lines committed since BASE follow .clang-format (Google
# style, 100 columns). Only the changed lines of the changed *.cc/*.h files
# are checked (git clang-format), so a commit that touches an old file does
# not have to reformat the rest of it.
#
#   bash scripts/check_format.sh         # lines changed since .clang-format was added
#   bash scripts/check_format.sh BASE    # lines changed in BASE..HEAD (e.g. HEAD~5)
#
# The default base is the commit that added .clang-format: the code before it
# was written without a formatter (247 of 385 files differ from it, ~2,100
# lines) and much of it is being edited, so the rule starts there: every C++
# line committed after .clang-format exists is formatted. (The 20 commits
# before it would fail on 432 lines in 47 files.) A shallow clone checks
# HEAD's own changes only (nothing at depth 1).
# Committed trees are compared (BASE..HEAD), not the working tree: format
# your uncommitted lines with `git clang-format -- FILES`.
# Exit status: 0 formatted (or nothing to check), 1 not (the files and the
# start of the diff that would fix them are printed), 2 no clang-format or
# a bad BASE. scripts/test.sh runs it when it is given no ctest arguments
# (KAPPA_FORMAT_CHECK=0 skips it there). CLANG_FORMAT picks the binary.
set -euo pipefail
cd "$(dirname "$0")/.."

first_tool() {
  local tool
  for tool in "$@"; do
    if command -v "$tool" >/dev/null; then
      echo "$tool"
      return
    fi
  done
  echo "check_format: none of $* found (scripts/setup.sh installs clang-format)" >&2
  exit 2
}
CLANG_FORMAT=${CLANG_FORMAT:-$(first_tool clang-format-14 clang-format)}
GIT_CLANG_FORMAT=$(first_tool git-clang-format-14 git-clang-format)

if (($# > 0)); then
  base=$1
else
  base=$(git log --diff-filter=A --format=%H -1 -- .clang-format)
  if [[ -z $base || $(git rev-parse --is-shallow-repository) == true ]] &&
    git rev-parse -q --verify HEAD~1 >/dev/null; then
    base=HEAD~1
  fi
  base=${base:-HEAD}
fi
if ! base_commit=$(git rev-parse -q --verify "$base^{commit}"); then
  echo "check_format: '$base' is not a commit" >&2
  exit 2
fi

short=$(git rev-parse --short "$base_commit")
files=$(git diff --name-only --diff-filter=d "$base_commit" HEAD -- '*.cc' '*.h')
if [[ -z $files ]]; then
  echo "check_format: no C++ files changed since $(git log -1 --format='%h %s' "$base_commit")"
  exit 0
fi
echo "check_format: $(wc -l <<<"$files") C++ files changed since" \
  "$(git log -1 --format='%h %s' "$base_commit")"

# git-clang-format 14 exits 0 whether or not it finds something: the output
# tells (a diff, or "no modified files" / "did not modify any files").
rc=0
diff=$("$GIT_CLANG_FORMAT" --binary "$CLANG_FORMAT" --style file --extensions cc,h --diff \
  "$base_commit" HEAD 2>&1) || rc=$?
if ((rc != 0)); then
  echo "$diff" >&2
  echo "check_format: git clang-format failed (exit $rc)" >&2
  exit 2
fi
if ! grep -q '^diff --git' <<<"$diff"; then
  echo "check_format: the changed lines follow .clang-format"
  exit 0
fi
offenders=$(sed -n 's|^diff --git a/\(.*\) b/.*|\1|p' <<<"$diff")
{
  echo "check_format: lines changed since $short are not formatted in:"
  sed 's/^/  /' <<<"$offenders"
  echo "The fix (first 120 lines of it):"
  head -n 120 <<<"$diff"
  echo "Apply it with: git clang-format $short -- $(tr '\n' ' ' <<<"$offenders")"
} >&2
exit 1
