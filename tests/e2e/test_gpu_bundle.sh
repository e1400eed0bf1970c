#!/usr/bin/env bash
# End-to-end test of the air-gapped GPU bundle, as far as it goes without a GPU:
#   1. scripts/gpu_bundle.sh writes a bundle into a temp dir; it must be < 60 MB.
#   2. With the Debian packages hidden from CMake (CMAKE_IGNORE_PREFIX_PATH and an
#      empty pkg-config path), a probe project must find none of them, and the
#      normal (non-bundle) configure of the bundled sources must fail: the hiding
#      is real. Without the hiding the probe finds them all (the probe works).
#   3. The same hidden configure with -DMIX_BUNDLE_DIR succeeds, `mixtrain` builds,
#      no compile used a header of those packages from /usr/include (the
#      compiler's .d files), the program's RPATH holds DIR/deps/lib and the loader
#      takes libopenblas, libgfortran and libz from there, and
#      `mixtrain --data synthetic --steps 3 --eval false` succeeds with
#      LD_LIBRARY_PATH unset.
#   3b. That build links the bundle's Open MPI (deps/openmpi, mpi.h and libmpi from
#      the bundle, none from the system), and the bundle's deps/openmpi/bin/mpirun
#      starts 2 ranks of it from a bare environment (env -i): a world of 2.
#   4. Where the CUDA toolkit (with cuDNN and NCCL) is installed: NCCL and cuDNN
#      laid out as Python wheels lay them out (include/, lib/ with only the
#      .so.N) are found through NCCL_ROOT / CUDNN_ROOT ahead of the toolkit's
#      own copies, by a hidden CUDA configure from the bundle, and the cuDNN
#      and NCCL sources compile against the wheels' headers (the .d files); the
#      cuDNN frontend the bundle carries packed is unpacked by CMake, found, and
#      runtime/cuda/cudnn_attention_graph.cc compiles against it.
# CUDA is off to keep CI time down; MIX_BUNDLE_TEST_CUDA=1 builds with
# -DMIX_WITH_CUDA=ON instead (nvcc from /usr/local/cuda/bin; compiles only).
# Exits 77 (skipped) where no bundle can be written: not a git checkout (e.g. the
# sources inside a bundle) or not a Debian machine with the -dev packages.
# Takes a few minutes on the 2-core CI machine, most of it the mixtrain build
# (a unity build, below) and the CUDA compiles of step 4.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if ! git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1 \
   || ! dpkg -s libspdlog-dev >/dev/null 2>&1; then
  echo "SKIP: $root is not a git checkout on a machine with the Debian -dev packages; no bundle to write"
  exit 77
fi
t_start=$(date +%s)
tmp="$(mktemp -d "${TMPDIR:-/tmp}/mix_gpu_bundle.XXXXXX")"
cleanup() { if [ -n "${MIX_KEEP_BUNDLE_TEST:-}" ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi; }
trap cleanup EXIT
bundle="$tmp/bundle"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
step() { echo "== $* ($(( $(date +%s) - t_start )) s)"; }

# The Debian packages live under /usr; on merged-/usr systems the prefix / (whose
# lib/ is /usr/lib) reaches them too, so both prefixes are ignored. pkg-config does
# not honour CMake's ignore list: give it an empty search path.
hide=(-DCMAKE_IGNORE_PREFIX_PATH="/usr;/")
hidden_env=(env PKG_CONFIG_LIBDIR="$tmp/no-pkgconfig" PKG_CONFIG_PATH= CMAKE_PREFIX_PATH=)

# ---- 1. the bundle ---------------------------------------------------------------
step "writing the bundle"
"$root/scripts/gpu_bundle.sh" "$bundle"
size=$(du -sb "$bundle" | cut -f1)
echo "bundle size: $size bytes ($(du -sh "$bundle" | cut -f1))"
[ "$size" -lt 60000000 ] || fail "bundle is $size bytes, not under 60 MB"
for f in README.txt src/CMakeLists.txt src/scripts/gpu_check.sh deps/include/spdlog/spdlog.h \
         deps/include/fmt/format-inl.h deps/include/CLI/CLI.hpp deps/include/nlohmann/json.hpp \
         deps/include/catch2/catch.hpp deps/include/cblas.h deps/include/openblas_config.h \
         deps/include/zlib.h deps/include/zconf.h deps/lib/libopenblas.so.0 deps/lib/libz.so.1 \
         deps/lib/libgfortran.so.5 deps/lib/libmpi.so.40 deps/openmpi/bin/mpirun deps/openmpi/bin/orterun \
         deps/openmpi/env.sh deps/openmpi/include/mpi.h deps/openmpi/lib/openmpi3/mca_pml_ob1.so; do
  [ -e "$bundle/$f" ] || fail "bundle lacks $f"
done
[ -d "$bundle/src/build" ] && fail "bundle contains the ignored build/ folder"

# ---- 2. the hiding is real ---------------------------------------------------------
step "checking that the Debian packages are hidden from CMake"
probe="$tmp/probe"
mkdir -p "$probe"
cat >"$probe/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.24)
project(probe LANGUAGES C CXX)
set(found "")
foreach(p spdlog fmt CLI11 nlohmann_json Catch2 ZLIB)
  find_package(${p} QUIET)
  if(${p}_FOUND)
    list(APPEND found ${p})
  endif()
endforeach()
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(OB QUIET openblas)
  if(OB_FOUND)
    list(APPEND found openblas)
  endif()
endif()
message(STATUS "PROBE_FOUND=[${found}]")
EOF
visible=$(cmake -S "$probe" -B "$probe/b1" 2>&1 | sed -n 's/.*PROBE_FOUND=\[\(.*\)\].*/\1/p')
hidden=$("${hidden_env[@]}" cmake -S "$probe" -B "$probe/b2" "${hide[@]}" 2>&1 | sed -n 's/.*PROBE_FOUND=\[\(.*\)\].*/\1/p')
echo "probe, plain: found [$visible]; hidden: found [$hidden]"
[ "$visible" = "spdlog;fmt;CLI11;nlohmann_json;Catch2;ZLIB;openblas" ] \
  || fail "the probe does not find every Debian package without hiding (found [$visible])"
[ -z "$hidden" ] || fail "hiding leaves these packages visible to CMake: [$hidden]"

# The deliberate failure: the bundled sources without MIX_BUNDLE_DIR cannot configure.
if "${hidden_env[@]}" cmake -S "$bundle/src" -B "$tmp/build-nobundle" "${hide[@]}" \
     -DMIX_WITH_MPI=OFF -DMIX_WITH_CUDA=OFF >"$tmp/nobundle.log" 2>&1; then
  fail "configure without MIX_BUNDLE_DIR succeeded with the packages hidden"
elif ! grep -q "spdlog" "$tmp/nobundle.log"; then
  fail "configure without MIX_BUNDLE_DIR failed, but not for spdlog:"; tail -20 "$tmp/nobundle.log"
else
  echo "ok: without MIX_BUNDLE_DIR the hidden configure fails: $(grep -m1 -o 'Could not find a package configuration file provided by "spdlog"' "$tmp/nobundle.log" || grep -m1 spdlog "$tmp/nobundle.log")"
fi

# ---- 3. configure, build and run from the bundle alone -------------------------------
build="$tmp/build"
# Build type None: no optimisation flags (CMakeLists.txt turns only an empty
# type into Release). The test checks where headers and libraries come from and
# that the program runs, not its speed, and a Release build was most of its time.
build_type=None
cuda=OFF
path="$PATH"
if [ "${MIX_BUNDLE_TEST_CUDA:-0}" = 1 ]; then
  cuda=ON
  path="/usr/local/cuda/bin:$PATH"
fi
step "configuring from the bundle (CUDA $cuda)"
if ! PATH="$path" "${hidden_env[@]}" cmake -S "$bundle/src" -B "$build" "${hide[@]}" \
     -DMIX_BUNDLE_DIR="$bundle" -DMIX_WITH_CUDA=$cuda -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_UNITY_BUILD=ON \
     >"$tmp/configure.log" 2>&1; then
  cat "$tmp/configure.log"
  echo "FAIL: configure from the bundle failed"
  exit 1
fi
grep "mixtrain:" "$tmp/configure.log" || true
grep -q "mixtrain: MPI from the bundle" "$tmp/configure.log" || fail "the bundle configure did not take MPI from the bundle"
# Nothing in the cache may point at the Debian packages' CMake files or pkg-config.
if grep -E '^(spdlog|fmt|CLI11|nlohmann_json|Catch2)_DIR:PATH=/|^ZLIB_(LIBRARY|INCLUDE_DIR)[A-Z_]*:[A-Z]*=/usr|^OPENBLAS_' \
     "$build/CMakeCache.txt"; then
  fail "the bundle configure found system packages (see the cache lines above)"
fi

# A unity build (CMake compiles a few sources as one) parses the bundled
# headers far fewer times, and those parses were most of this test's time.
# What it checks (header origins, the link, the run) is the same either way.
# Two sources that each define one name in an anonymous namespace cannot
# share a unity file, so a unity build that fails is tried again as a normal
# one: a real failure fails both.
step "building mixtrain"
if ! PATH="$path" cmake --build "$build" --target mixtrain -j "$(nproc)" >"$tmp/build.log" 2>&1; then
  echo "the unity build failed (last lines below); building mixtrain again without it"
  tail -5 "$tmp/build.log"
  if ! PATH="$path" "${hidden_env[@]}" cmake "$build" -DCMAKE_UNITY_BUILD=OFF >>"$tmp/configure.log" 2>&1 \
     || ! PATH="$path" cmake --build "$build" --target mixtrain -j "$(nproc)" >"$tmp/build.log" 2>&1; then
    tail -40 "$tmp/build.log"
    echo "FAIL: building mixtrain from the bundle failed"
    exit 1
  fi
fi
mixtrain="$build/mixtrain"
[ -x "$mixtrain" ] || { echo "FAIL: $mixtrain was not built"; exit 1; }

# Every header of the bundled libraries came from the bundle, none from /usr/include.
[ -n "$(find "$build" -name '*.o.d' -print -quit)" ] || fail "no compiler .d files to check the header origins with"
if leaks=$(find "$build" -name '*.o.d' -exec cat {} + | tr -s ' \\' '\n' | grep -E '^/usr/include/(spdlog|fmt|CLI|nlohmann|catch2)/|^/usr/include/(zlib|zconf)\.h|openblas-pthread|^/usr/include/(cblas|openblas_config)\.h|^/usr/.*openmpi' | sort -u) \
   && [ -n "$leaks" ]; then
  fail "compiles used system headers instead of the bundle's:"; echo "$leaks" | head
fi
grep -rqs --include="*.o.d" "$bundle/deps/include/spdlog/" "$build" || fail "no compile used the bundle's spdlog headers"
grep -rqs --include="*.o.d" "$bundle/deps/openmpi/include/mpi.h" "$build" || fail "no compile used the bundle's mpi.h"
link=$(find "$build" -path '*mixtrain.dir/link.txt' | head -1)
if grep -Eq 'lib(spdlog|fmt)\b|/usr/lib/[^ ]*(openblas|libz)' "$link"; then
  fail "the link line uses system libraries: $(cat "$link")"
fi

# Run-time search path and what the loader resolves with LD_LIBRARY_PATH unset.
rpath=$(readelf -d "$mixtrain" | sed -n 's/.*(RPATH).*\[\(.*\)\].*/\1/p')
echo "mixtrain RPATH: $rpath"
[[ ":$rpath:" == *":$bundle/deps/lib:"* ]] || fail "mixtrain's RPATH ($rpath) lacks $bundle/deps/lib"
needed=$(readelf -d "$mixtrain" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' | tr '\n' ' ')
echo "mixtrain NEEDED: $needed"
[[ " $needed " == *" libopenblas.so.0 "* && " $needed " == *" libz.so.1 "* ]] || fail "mixtrain does not link libopenblas.so.0 and libz.so.1"
[[ " $needed " == *"libspdlog"* || " $needed " == *"libfmt"* ]] && fail "mixtrain links spdlog/fmt although they are header-only"
resolved=$(env -u LD_LIBRARY_PATH ldd "$mixtrain")
for lib in libopenblas.so.0 libgfortran.so.5 libz.so.1 libmpi.so.40 libopen-pal.so.40 libhwloc.so.15; do
  where=$(echo "$resolved" | awk -v n="$lib" '$1 == n {print $3}')
  echo "  $lib => $where"
  [[ "$where" == "$bundle/deps/lib/"* ]] || fail "$lib is loaded from '$where', not from the bundle"
done

step "running mixtrain from the bundle build"
# One process, started without a launcher: no MPI_Init, and no environment needed.
if (cd "$tmp" && env -u LD_LIBRARY_PATH OPENBLAS_NUM_THREADS=1 "$mixtrain" --data synthetic --steps 3 --eval false) \
     >"$tmp/run.log" 2>&1; then
  tail -5 "$tmp/run.log"
else
  cat "$tmp/run.log"
  fail "mixtrain --data synthetic --steps 3 --eval false failed"
fi

step "2 ranks of the bundle build through the bundle's mpirun, from a bare environment"
root_flag=()
[ "$(id -u)" -eq 0 ] && root_flag=(--allow-run-as-root)
if (cd "$tmp" && env -i PATH=/usr/bin:/bin HOME="${HOME:-/root}" OPENBLAS_NUM_THREADS=1 \
      "$bundle/deps/openmpi/bin/mpirun" "${root_flag[@]}" -n 2 --oversubscribe --bind-to none \
      "$mixtrain" --data synthetic --steps 3 --eval false) >"$tmp/run2.log" 2>&1 \
   && grep -q '^\[rank 0/2\]' "$tmp/run2.log"; then
  tail -3 "$tmp/run2.log"
else
  cat "$tmp/run2.log"
  fail "2 ranks through the bundle's mpirun failed (or did not make a world of 2)"
fi

# ---- 4. CUDA from the bundle, NCCL and cuDNN from wheel-like roots --------------------
cuda_home=/usr/local/cuda
if [ "$cuda" = OFF ] && [ -x "$cuda_home/bin/nvcc" ] && [ -f "$cuda_home/include/cudnn.h" ] \
   && [ -f "$cuda_home/include/nccl.h" ]; then
  step "configuring the bundle with CUDA, NCCL and cuDNN from wheel-like roots"
  wheels="$tmp/wheels"
  mkdir -p "$wheels/cudnn/include" "$wheels/cudnn/lib" "$wheels/nccl/include" "$wheels/nccl/lib"
  ln -s "$cuda_home"/include/cudnn*.h "$wheels/cudnn/include/"
  ln -s "$cuda_home"/lib64/libcudnn*.so.9 "$wheels/cudnn/lib/"
  ln -s "$cuda_home"/include/nccl*.h "$wheels/nccl/include/"
  ln -s "$cuda_home"/lib64/libnccl.so.2 "$wheels/nccl/lib/"
  cbuild="$tmp/build-cuda"
  if ! PATH="$cuda_home/bin:$PATH" "${hidden_env[@]}" cmake -S "$bundle/src" -B "$cbuild" "${hide[@]}" \
       -DMIX_BUNDLE_DIR="$bundle" -DMIX_WITH_MPI=OFF -DMIX_WITH_CUDA=ON -DMIX_CUDA_ARCHS=90 \
       -DCUDNN_ROOT="$wheels/cudnn" -DNCCL_ROOT="$wheels/nccl" -DCMAKE_BUILD_TYPE="$build_type" >"$tmp/configure-cuda.log" 2>&1; then
    tail -20 "$tmp/configure-cuda.log"
    fail "the CUDA configure from the bundle with NCCL_ROOT / CUDNN_ROOT failed"
  else
    found=$(grep -m1 "mixtrain: NCCL" "$tmp/configure-cuda.log" || true)
    echo "$found"
    [[ "$found" == *"NCCL $wheels/nccl/lib/libnccl.so.2;"* && "$found" == *"cuDNN 9 $wheels/cudnn/lib/libcudnn.so.9"* ]] \
      || fail "NCCL_ROOT / CUDNN_ROOT did not win over the toolkit's libraries: $found"
    # cuDNN's frontend travels packed in the bundle; CMake unpacks it into the build folder.
    frontend=""
    if [ -f "$bundle/deps/cudnn-frontend.tar.xz" ]; then
      frontend="$cbuild/_deps/cudnn-frontend/include"
      grep -q "mixtrain: cuDNN frontend $frontend " "$tmp/configure-cuda.log" \
        || fail "the CUDA configure did not take the bundle's cuDNN frontend: $(grep -m1 'cuDNN frontend' "$tmp/configure-cuda.log")"
    else
      echo "the bundle carries no cuDNN frontend (setup.sh could not fetch it): its compile is not checked"
    fi
    step "compiling the cuDNN and NCCL sources from the bundle"
    objs=(runtime/ops/cuda/conv2d.cu.o collective/nccl_communicator.cu.o)
    [ -z "$frontend" ] || objs+=(runtime/cuda/cudnn_attention_graph.cc.o)
    for obj in "${objs[@]}"; do
      if ! (cd "$cbuild" && PATH="$cuda_home/bin:$PATH" make "$obj") >"$tmp/compile-cuda.log" 2>&1; then
        tail -20 "$tmp/compile-cuda.log"
        fail "compiling $obj from the bundle failed"
      fi
    done
    pairs=(conv2d.cu.o.d:"$wheels/cudnn/include/cudnn.h" nccl_communicator.cu.o.d:"$wheels/nccl/include/nccl.h")
    [ -z "$frontend" ] || pairs+=(cudnn_attention_graph.cc.o.d:"$frontend/cudnn_frontend.h")
    for pair in "${pairs[@]}"; do
      d=$(find "$cbuild" -name "${pair%%:*}" | head -1)
      grep -q "${pair#*:}" "$d" 2>/dev/null || fail "${pair%%:*} does not record ${pair#*:}"
    done
  fi
else
  echo "no CUDA toolkit with cuDNN and NCCL at $cuda_home (or the CUDA build above): step 4 skipped"
fi

step "done"
if [ "$failures" -gt 0 ]; then
  echo "FAIL: $failures check(s) failed"
  exit 1
fi
echo "PASS: the GPU bundle ($size bytes) builds and runs mixtrain with the Debian packages hidden"
