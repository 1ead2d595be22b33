#!/usr/bin/env bash
# Makes VENV's horovodrun as quiet as `make demo`; launch/install.sh runs it after it has
# installed Horovod and hvdtrain, and it is safe to run again.
#
#   bash launch/quiet-horovodrun.sh VENV
#
# horovodrun imports TensorFlow itself (its Gloo build check, in a forked process that
# mutes only Python's own output), and TensorFlow's C++ start-up notices reach the
# terminal: four lines before a job's first, from a plain `horovodrun ... hvdtrain train`.
# hvdtrain's workers drop their own (hvdtrain.quiet); this puts horovodrun behind the same
# import hook, as `python -m hvdtrain.quiet horovodrun ...` does: VENV/bin/horovodrun
# becomes Horovod's own entry point with hvdtrain.quiet's hook in first. HVDTRAIN_VERBOSE=1
# keeps every notice. A job that a failed worker ended closes with one line and that
# worker's exit status instead of Horovod's traceback (hvdtrain/machine/horovodrun.py). Were
# hvdtrain uninstalled, it runs as Horovod's own script does.
set -euo pipefail

die() { printf 'quiet-horovodrun: error: %s\n' "$*" >&2; exit 1; }

[ $# = 1 ] || die "usage: bash launch/quiet-horovodrun.sh VENV"
venv=$(cd "$1" 2>/dev/null && pwd) || die "$1 is not a folder"
script=$venv/bin/horovodrun
[ -x "$venv/bin/python" ] || die "$venv has no bin/python"
[ -f "$script" ] || die "$venv has no bin/horovodrun: install Horovod first"

# Written beside it and renamed over it: a horovodrun starting meanwhile reads one whole.
tmp=$(mktemp "$script.XXXXXX")
trap 'rm -f "$tmp"' EXIT
cat > "$tmp" <<EOF
#!$venv/bin/python
# Horovod's horovodrun behind hvdtrain.quiet's import hook, written by hvdtrain's
# launch/quiet-horovodrun.sh: the TensorFlow start-up notices of horovodrun's own Gloo
# build check are dropped (HVDTRAIN_VERBOSE=1 keeps them).
import sys

try:
    from hvdtrain.machine.horovodrun import main
except ImportError:  # hvdtrain is gone from this venv: Horovod's horovodrun as it was
    from horovod.runner.launch import run_commandline as main

if __name__ == "__main__":
    sys.exit(main())
EOF
chmod 755 "$tmp"
mv "$tmp" "$script"
trap - EXIT
