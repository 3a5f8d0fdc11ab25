#!/usr/bin/env bash
# Runs the commands of the guide (docs/GUIDE.md, chapters docs/guide/NN-*.md), so the guide cannot
# rot: the test command runs this on a small model (label `guide`).
#
#   bash scripts/guide.sh [--pictures] [--tessera BIN] [--keep] [NN ...]
#
# In a chapter, every block fenced ```sh runs, in order, in one bash (set -e -o pipefail) in a
# fresh folder of the chapter's own, with `tessera` on PATH and `scripts/` linked to the
# repository's (so `bash scripts/cluster.sh ...` runs as from the root); ```text blocks show what the
# commands print and are not run. A line `# ci: COMMAND` inside a ```sh block replaces the next
# command (with its `\` continuations) when the test runs: a small variant of a big command. An
# image link ![...](img/NAME.svg) names a picture the chapter's commands write as NAME.svg; the
# script checks that they do, and that docs/guide/img/NAME.svg is committed.
#
#   --pictures   run the commands as shown (no `# ci:` variants) and copy the pictures into
#                docs/guide/img/: the one script that regenerates them
#   --tessera    the binary (default: build/apps/tessera/tessera)
#   --keep       keep each chapter's folder and say where
#   NN ...       only these chapters (their two-digit numbers)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/apps/tessera/tessera
pictures=0 keep=0
chapters=()
while [ $# -gt 0 ]; do
  case $1 in
    --pictures) pictures=1 ;;
    --keep) keep=1 ;;
    --tessera) bin=$(realpath "$2"); shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    [0-9][0-9]) chapters+=("$1") ;;
    *) echo "guide.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$bin" ] || { echo "guide.sh: no tessera binary at $bin (build first, or --tessera BIN)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1  # more ranks than this machine's cores
# A test cluster a chapter brings up (scripts/cluster.sh) has a prefix of the guide's own, and is
# taken down after the chapter whatever happened.
export TESSERA_CLUSTER_PREFIX=tsrg
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
ln -s "$bin" "$tools/tessera"

# script_of CHAPTER: the chapter's ```sh blocks as one bash script; `# ci:` replaces the next
# command unless --pictures.
script_of() {
  awk -v pictures="$pictures" '
    /^```sh[[:space:]]*$/ { inside = 1; next }
    /^```/ && inside { inside = 0; next }
    !inside { next }
    skipping { if ($0 !~ /\\$/) skipping = 0; next }
    /^[[:space:]]*# ci: / {
      if (!pictures) { sub(/^[[:space:]]*# ci: /, ""); print; replace = 1 }
      next
    }
    replace { if ($0 ~ /\\$/) skipping = 1; replace = 0; next }
    { print }
  ' "$1"
}

failed=0 ran=0
start=$SECONDS
for md in "$root"/docs/guide/[0-9][0-9]-*.md; do
  name=$(basename "$md" .md)
  if [ ${#chapters[@]} -gt 0 ] && [[ " ${chapters[*]} " != *" ${name:0:2} "* ]]; then continue; fi
  work=$(mktemp -d)
  t0=$SECONDS
  script_of "$md" >"$work/.guide.sh"
  ln -s "$root/scripts" "$work/scripts"
  if (cd "$work" && PATH="$tools:$PATH" bash -x -e -o pipefail .guide.sh) >"$work/.guide.log" 2>&1; then
    status=ok
  else
    status=FAIL
  fi
  # Only after a chapter that uses one: the test command runs the chapters at the same time.
  if grep -q "cluster.sh" "$work/.guide.sh" && ip netns list 2>/dev/null | grep -q "^$TESSERA_CLUSTER_PREFIX-"; then
    bash "$root/scripts/cluster.sh" down >/dev/null 2>&1 || true
  fi
  # The pictures the chapter shows: each must be written by its commands, and committed.
  while read -r img; do
    [ -n "$img" ] || continue
    if [ ! -s "$work/$img" ]; then
      echo "  $name: the commands did not write $img" >>"$work/.guide.log"; status=FAIL
    elif [ $pictures = 1 ]; then
      cp "$work/$img" "$root/docs/guide/img/$img"
    elif [ ! -s "$root/docs/guide/img/$img" ]; then
      echo "  $name: docs/guide/img/$img is not committed (bash scripts/guide.sh --pictures)" >>"$work/.guide.log"
      status=FAIL
    fi
  done < <(grep -oE '\]\(img/[A-Za-z0-9_.-]+\.svg\)' "$md" | sed 's/^](img\///; s/)$//' | sort -u)
  ran=$((ran + 1))
  echo "$status $name ($((SECONDS - t0)) s)"
  if [ $status != ok ]; then
    failed=$((failed + 1))
    tail -30 "$work/.guide.log" | sed 's/^/  | /'
  fi
  if [ $keep = 1 ]; then echo "  kept $work"; else rm -rf "$work"; fi
done
[ $ran -gt 0 ] || { echo "guide.sh: no chapter matched ${chapters[*]}" >&2; exit 2; }
echo "guide: $((ran - failed)) of $ran chapters passed, $((SECONDS - start)) s"
[ $failed -eq 0 ]
