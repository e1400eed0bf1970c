# Argument checks shared by the scripts in scripts/: source this after setting
# `prog`, the name that starts each message. Every failure exits with status
# 2, as a bad flag of mixtrain does.
die() { echo "$prog: $*" >&2; exit 2; }
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"; }

# usage_if_help "$@" <<'EOF' ... EOF: keeps the usage text on stdin for `usage`,
# and with -h or --help as the first argument prints it and exits 0. Call it
# before anything that has an effect (set-up, build, mkdir); a script that
# parses flags also answers `-h | --help) usage ;;` in its loop.
usage_if_help() {
  usage_text="$(cat)"
  case "${1:-}" in -h | --help) usage ;; esac
}
usage() { printf '%s\n' "$usage_text"; exit 0; }
