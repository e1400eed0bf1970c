# Argument checks shared by the scripts in scripts/: source this after setting
# `prog`, the name that starts each message. Every failure exits with status
# 2, as a bad flag of mixtrain does.
die() { echo "$prog: $*" >&2; exit 2; }
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see the header of this script)"; }
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"; }
