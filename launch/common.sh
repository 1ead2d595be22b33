# shellcheck shell=bash
# Shared by the launchers (local.sh, slurm/train.sbatch); sourced, not run.
# The caller sets PROG (its name, for messages) before sourcing.

die() { printf '%s: error: %s\n' "${PROG:-launch}" "$*" >&2; exit 2; }

require_positive_int() {  # VALUE WHAT
    case $1 in
        '' | *[!0-9]* | 0 | 0*) die "$2 must be a positive integer, got '$1'" ;;
    esac
}

# horovodrun and hvdtrain come from PATH; if they are not there, from the project's
# venv (HVDTRAIN_VENV, default <checkout>/.venv), so `make setup` is enough.
use_venv() {  # CHECKOUT
    if ! command -v horovodrun >/dev/null 2>&1; then
        local venv=${HVDTRAIN_VENV:-$1/.venv}
        [ -x "$venv/bin/horovodrun" ] \
            || die "horovodrun not found on PATH nor in $venv: run 'make setup' or activate the venv"
        PATH="$venv/bin:$PATH"
        export PATH
    fi
}

# Splits the launcher's arguments at the first "--": what comes before goes to
# horovodrun, what comes after to `hvdtrain train`; without "--", everything goes to
# hvdtrain train. HOROVODRUN_ARGS (split on blanks) is put before horovodrun's own,
# so flags given on the command line win. Sets HVD_ARGS and TRAIN_ARGS.
# shellcheck disable=SC2034  # both arrays are read by the launcher that sourced this
split_args() {
    HVD_ARGS=()
    TRAIN_ARGS=()
    if [ -n "${HOROVODRUN_ARGS:-}" ]; then
        read -r -a HVD_ARGS <<< "$HOROVODRUN_ARGS"
    fi
    local arg has_separator=0
    for arg in "$@"; do
        if [ "$arg" = -- ]; then has_separator=1; break; fi
    done
    if [ "$has_separator" = 1 ]; then
        while [ "$1" != -- ]; do HVD_ARGS+=("$1"); shift; done
        shift
    fi
    TRAIN_ARGS=("$@")
}
