#!/usr/bin/env bash
# End-to-end test of mixrun: the mpirun command line it builds (--dry-run, in a
# clean environment so that the caller's variables do not leak into the
# expectations), its usage errors (exit 2, naming the flag), a missing mpirun,
# and one real two-rank run. Exits 77 (skipped) only when no mpirun exists for
# the real run, after every dry-run check has passed.
set -euo pipefail

: "${MIX_BUILD_DIR:?set MIX_BUILD_DIR to the build directory}"
MIXRUN="$MIX_BUILD_DIR/mixrun"
if [[ ! -x $MIXRUN ]]; then
  echo "FAIL: $MIXRUN is not built"
  exit 1
fi

# What std::thread::hardware_concurrency() reports (glibc's get_nprocs).
CORES=$(getconf _NPROCESSORS_ONLN)
MORE=$((CORES + 1))
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# dry VAR=VALUE... -- MIXRUN_ARGS...: the dry-run line, with only PATH and the given variables set.
dry() {
  local envs=()
  while [[ $1 != "--" ]]; do
    envs+=("$1")
    shift
  done
  shift
  env -i PATH="$PATH" ${envs[@]+"${envs[@]}"} "$MIXRUN" --dry-run "$@"
}

# has LINE WORDS: WORDS occur in LINE as whole words.
has() { [[ " $1 " == *" $2 "* ]]; }
expect_has() { has "$1" "$2" || fail "'$2' missing from: $1"; }
expect_lacks() { ! has "$1" "$2" || fail "'$2' unexpected in: $1"; }
expect_contains() { [[ $1 == *"$2"* ]] || fail "'$2' missing from: $1"; }

# expect_usage_error WHAT ARGS...: exit status 2 and a message that names WHAT.
expect_usage_error() {
  local what=$1 rc=0 err
  shift
  err=$(env -i PATH="$PATH" "$MIXRUN" "$@" 2>&1 >/dev/null) || rc=$?
  [[ $rc -eq 2 ]] || fail "mixrun $* exited $rc, expected 2"
  [[ $err == *"$what"* ]] || fail "mixrun $* did not name '$what': $err"
}

echo "mixrun: $CORES cores here"

# ---- -n 4 on this machine: oversubscribed only when 4 exceeds the cores -------
line=$(dry -- -n 4 -- prog --flag value)
[[ $line == "mpirun "* ]] || fail "does not start with mpirun: $line"
[[ $line == *" prog --flag value" ]] || fail "program and arguments not last: $line"
expect_has "$line" "-n 4"
expect_lacks "$line" "--host"
if [[ $(id -u) -eq 0 ]]; then
  expect_has "$line" "--allow-run-as-root"
else
  expect_lacks "$line" "--allow-run-as-root"
fi
if ((4 > CORES)); then
  expect_has "$line" "--oversubscribe"
  expect_has "$line" "--bind-to none"
  expect_has "$line" "-x OPENBLAS_NUM_THREADS=1"
else
  expect_lacks "$line" "--oversubscribe"
  expect_lacks "$line" "--bind-to none"
  expect_lacks "$line" "-x OPENBLAS_NUM_THREADS=1"
fi

# ---- -n 4 with hosts: the slots decide, never the local cores ----------------
line=$(dry -- -n 4 --hosts node1:2,node2:2 -- prog)
expect_has "$line" "--host node1:2,node2:2"
expect_has "$line" "-n 4"
expect_lacks "$line" "--oversubscribe"
expect_lacks "$line" "OPENBLAS_NUM_THREADS=1"
line=$(dry -- -n 4 --hosts node1:2,node2:2 --oversubscribe -- prog)
expect_has "$line" "--oversubscribe"
expect_has "$line" "--bind-to none"
expect_usage_error "slots" -n 8 --hosts node1:2,node2 -- prog

# ---- oversubscription on this machine ----------------------------------------
line=$(dry -- -n "$MORE" -- prog)
expect_has "$line" "--oversubscribe"
expect_has "$line" "--bind-to none"
expect_has "$line" "-x OPENBLAS_NUM_THREADS=1"
expect_has "$line" "-x OMP_NUM_THREADS=1"
line=$(dry -- -n 1 -- prog)
expect_lacks "$line" "--oversubscribe"
expect_lacks "$line" "--bind-to"
line=$(dry -- -n 1 --oversubscribe -- prog)
expect_has "$line" "--oversubscribe"
expect_has "$line" "--bind-to none"
expect_lacks "$line" "OPENBLAS_NUM_THREADS=1"  # one rank fits: no thread cap
# A thread count the user chose is forwarded, not overridden.
line=$(dry OPENBLAS_NUM_THREADS=3 -- -n "$MORE" -- prog)
expect_has "$line" "-x OPENBLAS_NUM_THREADS"
expect_lacks "$line" "-x OPENBLAS_NUM_THREADS=1"
expect_has "$line" "-x OMP_NUM_THREADS=1"

# ---- inside a Slurm allocation: -n from SLURM_NTASKS, Slurm's slots decide ----
# (tests/cluster/test_slurm.py runs it in a real allocation.)
SLURM_JOB=(SLURM_JOB_ID=42 "SLURM_NTASKS=$MORE" "SLURM_JOB_NODELIST=node[1-2]")
line=$(dry "${SLURM_JOB[@]}" -- -- prog 2>/dev/null)
expect_has "$line" "-n $MORE"
expect_lacks "$line" "--oversubscribe"  # more ranks than local cores: the allocation's slots decide
expect_lacks "$line" "--bind-to none"
expect_lacks "$line" "OPENBLAS_NUM_THREADS=1"
err=$(dry "${SLURM_JOB[@]}" -- -- prog 2>&1 >/dev/null)
expect_contains "$err" "inside Slurm job 42 on node[1-2]"
line=$(dry "${SLURM_JOB[@]}" -- -n 1 -- prog 2>/dev/null)
expect_has "$line" "-n 1"  # an explicit -n wins over SLURM_NTASKS
line=$(dry "${SLURM_JOB[@]}" -- -n 1 --oversubscribe -- prog 2>/dev/null)
expect_has "$line" "--oversubscribe"  # asked for, still given
rc=0
err=$(env -i PATH="$PATH" SLURM_JOB_ID=42 "$MIXRUN" --dry-run -- prog 2>&1 >/dev/null) || rc=$?
[[ $rc -eq 2 && $err == *"SLURM_NTASKS"* ]] || fail "an allocation without SLURM_NTASKS and no -n: exit $rc, $err"

# ---- environment forwarding --------------------------------------------------
line=$(dry MIX_FOO=bar NCCL_DEBUG=WARN OMP_NUM_THREADS=2 OMPI_MCA_foo=1 FOO_MIX=1 -- -n 1 -- prog)
expect_has "$line" "-x MIX_FOO"
expect_has "$line" "-x NCCL_DEBUG"
expect_has "$line" "-x OMP_NUM_THREADS"
expect_lacks "$line" "-x OMPI_MCA_foo"
expect_lacks "$line" "-x FOO_MIX"
[[ $line != *"bar"* ]] || fail "forwarded a value instead of a name: $line"

# ---- which mpirun, quoting, program without -- -------------------------------
line=$(dry MIX_MPIRUN=/opt/ompi/bin/mpirun -- -n 1 -- prog)
[[ $line == "/opt/ompi/bin/mpirun "* ]] || fail "MIX_MPIRUN not used: $line"
line=$(dry MIX_MPIRUN=/opt/ompi/bin/mpirun -- -n 1 --mpirun /usr/local/bin/mpirun -- prog)
[[ $line == "/usr/local/bin/mpirun "* ]] || fail "--mpirun does not win over MIX_MPIRUN: $line"
line=$(dry -- -n 1 -- prog 'a b' "it's" '')
[[ $line == *" prog 'a b' 'it'\\''s' ''" ]] || fail "arguments not shell-quoted: $line"
line=$(dry -- -n 2 /bin/echo -x hi)
[[ $line == *" -n 2 /bin/echo -x hi" ]] || fail "program without -- not passed through: $line"

# ---- usage errors ------------------------------------------------------------
expect_usage_error "--bogus" --bogus -n 2 -- prog
expect_usage_error "--bogus" -n 2 --bogus prog
expect_usage_error "--np" -n 0 -- prog
expect_usage_error "--np" -n two -- prog
expect_usage_error "--np" -- prog
expect_usage_error "--hosts" -n 2 --hosts node1: -- prog
expect_usage_error "--hosts" -n 2 --hosts node1:0 --oversubscribe -- prog
expect_usage_error "--hosts" -n 2 --hosts node1:2x -- prog
expect_usage_error "--np" -n 1000001 --oversubscribe -- prog
expect_usage_error "PROGRAM" -n 2 --
expect_usage_error "PROGRAM" -n 2
rc=0
env -i PATH="$PATH" "$MIXRUN" --help >/dev/null || rc=$?
[[ $rc -eq 0 ]] || fail "--help exited $rc"

# ---- mpirun missing ----------------------------------------------------------
rc=0
err=$(env -i PATH="$PATH" "$MIXRUN" -n 1 --mpirun /nonexistent/mpirun -- /bin/true 2>&1) || rc=$?
[[ $rc -ne 0 ]] || fail "a missing mpirun exited 0"
expect_contains "$err" "scripts/setup.sh"
expect_contains "$err" "mpirun was not found"

if ((failures > 0)); then
  echo "$failures check(s) failed"
  exit 1
fi

# ---- a real run ----------------------------------------------------------------
MPIRUN=${MIX_MPIRUN:-mpirun}
if ! command -v "$MPIRUN" >/dev/null 2>&1; then
  echo "SKIP: no mpirun ('$MPIRUN') for the real run; the dry-run checks passed"
  exit 77
fi
out=$(MIX_MPIRUN="$MPIRUN" "$MIXRUN" -n 2 -- /bin/echo hi)
hi_lines=$(grep -cx "hi" <<<"$out" || true)
[[ $hi_lines -eq 2 ]] || fail "mixrun -n 2 -- /bin/echo hi printed $hi_lines 'hi' lines: $out"
# Each rank sees a MIX_ variable of the caller.
out=$(MIX_MPIRUN="$MPIRUN" MIX_FOO=forwarded "$MIXRUN" -n 2 -- /bin/sh -c 'echo "foo=$MIX_FOO"')
foo_lines=$(grep -cx "foo=forwarded" <<<"$out" || true)
[[ $foo_lines -eq 2 ]] || fail "MIX_FOO did not reach both ranks: $out"
# A failing rank fails the launch.
rc=0
MIX_MPIRUN="$MPIRUN" "$MIXRUN" -n 2 -- /bin/false >/dev/null 2>&1 || rc=$?
[[ $rc -ne 0 ]] || fail "mixrun -n 2 -- /bin/false exited 0"

if ((failures > 0)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: mixrun"
