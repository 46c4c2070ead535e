#!/usr/bin/env bash
# Copies revisions of this repository into side-by-side source trees for tools/ab_bench.sh and
# tools/ab_check.sh: each NAME=REV becomes .ab/NAME (ignored by git; a GPU call carries the
# folder with its `carry` list). Built here so that the trees do not depend on the GPU
# machine's copy of .git.
#   bash tools/make_trees.sh main=main v36=18e4b0c v37=abe7f4f
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 NAME=REV [NAME=REV ...]"; exit 2; }
grep -qx '/.ab/' "$(git rev-parse --git-dir)/info/exclude" 2>/dev/null ||
  { mkdir -p "$(git rev-parse --git-dir)/info"; echo '/.ab/' >>"$(git rev-parse --git-dir)/info/exclude"; }
for spec in "$@"; do
  name=${spec%%=*} rev=${spec#*=}
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "tree name '$name': use letters, digits, '.', '_' or '-'"; exit 2; }
  git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "$rev: not a commit"; exit 2; }
  rm -rf ".ab/$name"
  mkdir -p ".ab/$name"
  git archive "$rev" | tar -x -C ".ab/$name"
  echo ".ab/$name: $(git rev-parse --short "$rev")"
done
