#!/bin/sh
# On the dev machine, from the repository root: builds the baseline arm of a same-run A/B — commit
# BASE's hybrid-modes and hybrid-bench bundles and both native libraries — into .device/base/, so that hybrid-run.sh
# (which runs that arm after its own when .device/base exists) compares a change against BASE on one
# machine in one call, without a switch in the code. Needs a setup checkout (node_modules) and nvcc.
#   sh apps/bench/device/prepare-base.sh 007e23c      # ~4 min on 2 cores; rm -rf .device/base to drop the arm
set -eu
BASE=${1:?usage: prepare-base.sh COMMIT}
ROOT=$(pwd)
WT=$(mktemp -d /tmp/hg-base-XXXXXX)
trap 'git -C "$ROOT" worktree remove --force "$WT" 2>/dev/null || rm -rf "$WT"' EXIT
git worktree add -f --detach "$WT" "$BASE" > /dev/null
# The workspace's installed packages, as the dev checkout has them (their links are relative, so they
# point into the worktree's own packages).
ln -s "$ROOT/node_modules" "$WT/node_modules"
for d in packages/* apps/*; do
  if [ -d "$ROOT/$d/node_modules" ] && [ -d "$WT/$d" ]; then cp -a "$ROOT/$d/node_modules" "$WT/$d/"; fi
done
for p in spec core memtier scheduler selectors kernels-cpu kernels-cuda runtime; do
  (cd "$WT/packages/$p" && "$ROOT/node_modules/.bin/tsup" > /dev/null)
done
(cd "$WT/packages/kernels-cpu" && node scripts/build-native.mjs)
(cd "$WT/packages/kernels-cuda" && HYBRIDGEN_BUILD_CUDA=1 node scripts/build-native.mjs)
rm -rf .device/base && mkdir -p .device/base/lib
cp "$WT/packages/kernels-cpu/lib/libhgcpu.so" "$WT/packages/kernels-cuda/lib/libhgcuda.so" .device/base/lib/
for b in hybrid-modes cuda/hybrid-bench; do
  (cd "$WT" && bun build --target=bun --external 'bun:*' "apps/bench/src/$b.ts" --outfile "$ROOT/.device/base/$(basename $b).js" > /dev/null)
done
git -C "$WT" rev-parse --short HEAD > .device/base/BUILT
echo "prepare-base: .device/base holds $(cat .device/base/BUILT)'s bundles and libraries ($(du -sh .device/base | cut -f1))"
