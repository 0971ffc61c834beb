#!/usr/bin/env bash
# Records this host's golden sets from main's pre-kit DSA: the decode outputs
# (tests/data/dsa_golden/FINGERPRINT-jaxVERSION.npz) and the training figures under both XLA
# settings (a set of tests/data/dsa_training_golden.json). Run it where the golden tests skip with
# "no golden set was recorded on a host like this one"; tests/golden_hosts.py says why hosts differ.
#
#   tests/record_goldens.sh            (uses ./dev's virtualenv: .venv, or $HISPARSE_VENV)
#
# It checks the pre-kit commit out into a temporary git worktree, builds that package (with its
# CPU extension) into a temporary folder and runs the recorders from another folder, so the old
# package, not this tree, is imported; XLA_FLAGS are unset (sets are XLA's defaults). The files
# land in tests/data only when every recorder has finished. Needs git history back to that commit.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(cd "$REPO" && cd "${HISPARSE_VENV:-.venv}" 2>/dev/null && pwd)" || {
  echo "record_goldens: no virtualenv at ${HISPARSE_VENV:-.venv}: run ./dev build first" >&2; exit 2; }
PY="$VENV/bin/python"
COMMIT="$("$PY" "$REPO/tests/golden_hosts.py" --pre-kit-commit)"

WORK="$(mktemp -d)"
cleanup() {
  git -C "$REPO" worktree remove --force "$WORK/src" 2>/dev/null || true
  git -C "$REPO" worktree prune
  rm -rf "$WORK"
}
trap cleanup EXIT
git -C "$REPO" worktree add --quiet --detach "$WORK/src" "$COMMIT"
echo "record_goldens: building main's pre-kit package (${COMMIT:0:12})" >&2
"$PY" -m pip install -q --no-build-isolation --no-deps --target "$WORK/site" -Cbuild-dir="$WORK/build" "$WORK/src"

cd "$WORK"  # not a source tree: the installed pre-kit package is the one imported
export PYTHONPATH="$WORK/site" JAX_PLATFORMS=cpu
unset XLA_FLAGS
"$PY" - "$WORK/site" <<'PY'
import sys
import hisparse_jax
if not hisparse_jax.__file__.startswith(sys.argv[1]):
    sys.exit(f"record_goldens: imported {hisparse_jax.__file__}, not the pre-kit package in {sys.argv[1]}")
PY
mkdir "$WORK/out"
cp "$REPO/tests/data/dsa_training_golden.json" "$WORK/out/"
"$PY" "$REPO/tests/models/dsa_golden.py" "$WORK/out"
for setting in off on; do
  "$PY" "$REPO/tests/train/dsa_training_golden.py" "$setting" "$WORK/out/dsa_training_golden.json"
done
cp "$WORK/out/"*.npz "$REPO/tests/data/dsa_golden/"
cp "$WORK/out/dsa_training_golden.json" "$REPO/tests/data/dsa_training_golden.json"
echo "record_goldens: wrote $(cd "$WORK/out" && ls *.npz) and this host's set of dsa_training_golden.json" >&2
