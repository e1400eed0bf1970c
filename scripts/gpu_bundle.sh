#!/usr/bin/env bash
# Writes a self-contained folder for building mixtrain on an air-gapped GPU node
# that has only the NVIDIA driver, a CUDA toolkit (with NCCL/cuDNN), CMake and a
# host C++ compiler: no Debian -dev packages, no Open MPI, no network.
#
#   scripts/gpu_bundle.sh DIR
#
# DIR/src          the sources (git ls-files + untracked files that are not ignored)
# DIR/deps/include headers of spdlog, fmt, CLI11, nlohmann-json, Catch2, OpenBLAS, zlib, libjpeg-turbo, libpng
# DIR/deps/lib     libopenblas.so.0 (+ libgfortran.so.5, libquadmath.so.0 it needs), libz.so.1, libjpeg.so.62, libpng16.so.16,
#                  libmpi.so.40 and the Open MPI libraries it and the launcher need
# DIR/deps/openmpi Debian's Open MPI runtime, relocatable: bin/mpirun (starts the ranks), env.sh, plugins, mpi.h
# DIR/deps/cudnn-frontend.tar.xz  cuDNN's header-only frontend, packed (fused_attention's cuDNN path)
# DIR/README.txt   how to build from it (cmake -DMIX_BUNDLE_DIR=DIR, or gpu_check.sh --bundle DIR)
#
# Run it on a development machine where scripts/setup.sh installed the packages.
# DIR must be new, empty, or a folder an earlier run of this script wrote.
# Fails when the result is not under 60 MB (60,000,000 bytes).
set -euo pipefail

prog=gpu_bundle
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"  # usage_if_help
usage_if_help "$@" <<'EOF'
usage: scripts/gpu_bundle.sh DIR
Writes a self-contained folder for building mixtrain on an air-gapped GPU node (NVIDIA driver, CUDA toolkit,
CMake, a C++ compiler; no network): DIR/src (the sources), DIR/deps (headers, OpenBLAS, zlib, libjpeg-turbo, libpng,
Open MPI's runtime with its launcher DIR/deps/openmpi/bin/mpirun), DIR/README.txt.
Run it where scripts/setup.sh installed the packages; fails when the result is not under 60 MB.
  DIR   new, empty, or written by an earlier run; outside the checkout or in a git-ignored folder (e.g. runs/)
EOF
die() { echo "gpu_bundle: $*" >&2; exit 1; }
[ $# -eq 1 ] || { echo "usage: scripts/gpu_bundle.sh DIR" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$1"
limit=60000000
marker=".mixtrain-gpu-bundle"

for tool in git dpkg dpkg-query readelf tar; do
  command -v "$tool" >/dev/null 2>&1 || die "needs '$tool' (run this on a Debian development machine)"
done
git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1 || die "$root is not a git checkout"

abs="$(realpath -m "$dir")"
case "$abs/" in
  "$root"/*)  # inside the checkout only where git ignores it (e.g. runs/), else it would copy itself
    git -C "$root" check-ignore -q "$abs" || die "DIR must be outside the source tree or in a git-ignored folder (e.g. runs/)" ;;
esac
if [ -e "$dir" ]; then
  [ -d "$dir" ] || die "$dir exists and is not a folder"
  if [ -n "$(ls -A "$dir")" ]; then
    [ -f "$dir/$marker" ] || die "$dir is not empty and was not written by gpu_bundle.sh; refusing to overwrite it"
    rm -rf "${dir:?}/src" "${dir:?}/deps" "${dir:?}/README.txt" "${dir:?}/$marker"
  fi
fi
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
touch "$dir/$marker"
mkdir -p "$dir/src" "$dir/deps/include" "$dir/deps/lib" "$dir/deps/licenses"

# ---- (a) sources --------------------------------------------------------------
# Tracked files plus untracked files that .gitignore does not exclude; files
# deleted in the working tree and submodule entries (folders) are left out.
while IFS= read -r -d '' f; do
  if [ -f "$root/$f" ] || [ -L "$root/$f" ]; then
    printf '%s\0' "$f"
  fi
done < <(git -C "$root" ls-files -z --cached --others --exclude-standard | sort -zu) >"$dir/.srclist"
tar -C "$root" --null --no-recursion -T "$dir/.srclist" -cf - | tar -C "$dir/src" -xf -
n_src=$(tr -cd '\0' <"$dir/.srclist" | wc -c)
rm -f "$dir/.srclist"
[ -f "$dir/src/CMakeLists.txt" ] || die "copying the sources failed (no CMakeLists.txt in $dir/src)"
# The commit, for `mixtrain --version` on the GPU node (the copy has no .git).
commit=$(git -C "$root" rev-parse --short=12 HEAD)
git -C "$root" diff --quiet HEAD || commit="$commit+changes"
echo "$commit" >"$dir/src/.mix_commit"

# ---- (b) header-only libraries from their Debian packages -----------------------
versions="$dir/deps/VERSIONS.txt"
: >"$versions"
pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo "?"; }
note_pkg() {  # package: version line + its copyright file
  echo "$1 $(pkg_version "$1")" >>"$versions"
  if [ -f "/usr/share/doc/$1/copyright" ]; then
    cp "/usr/share/doc/$1/copyright" "$dir/deps/licenses/$1.copyright"
  fi
}
# owner_pkg FILE BASENAME: the package that installed FILE, noted in VERSIONS.txt.
owner_pkg() {
  local pkg
  pkg="$(dpkg -S "$1" 2>/dev/null || dpkg -S "/lib/${1#/usr/lib/}" 2>/dev/null || true)"
  pkg="${pkg%%:*}"
  if [ -n "$pkg" ]; then
    note_pkg "$pkg"
  fi
  echo "  $2 <- $1 (${pkg:-unknown package})" >>"$versions"
}
copy_pkg_headers() {  # package: every file it installs under /usr/include, same layout
  local pkg="$1" n=0 f
  dpkg -s "$pkg" >/dev/null 2>&1 || die "package $pkg is not installed (scripts/setup.sh installs it)"
  while IFS= read -r f; do
    case "$f" in /usr/include/*) ;; *) continue ;; esac
    [ -f "$f" ] || continue
    mkdir -p "$dir/deps/include/$(dirname "${f#/usr/include/}")"
    cp -p "$f" "$dir/deps/include/${f#/usr/include/}"
    n=$((n + 1))
  done < <(dpkg -L "$pkg")
  [ "$n" -gt 0 ] || die "package $pkg installs no headers under /usr/include"
  note_pkg "$pkg"
}
for pkg in libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev catch2 zlib1g-dev libjpeg62-turbo-dev libpng-dev; do
  copy_pkg_headers "$pkg"
done
# jpeglib.h includes jconfig.h, which Debian keeps in the multiarch folder.
for f in "$dir"/deps/include/*-linux-gnu*/jconfig.h; do
  [ -f "$f" ] && cp -p "$f" "$dir/deps/include/jconfig.h"
done
# spdlog is used header-only (SPDLOG_HEADER_ONLY + FMT_HEADER_ONLY): that needs
# fmt's format-inl.h and spdlog's -inl.h implementation files.
for f in fmt/format-inl.h fmt/format.h spdlog/spdlog-inl.h spdlog/sinks/stdout_color_sinks-inl.h \
         CLI/CLI.hpp nlohmann/json.hpp catch2/catch.hpp zlib.h zconf.h jpeglib.h jconfig.h png.h pngconf.h pnglibconf.h; do
  [ -f "$dir/deps/include/$f" ] || die "bundled headers lack $f"
done

# ---- (c) shared libraries: OpenBLAS (pthread flavour) and zlib -------------------
multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
ob_inc="" ob_lib=""
if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openblas; then
  ob_inc="$(pkg-config --variable=includedir openblas)"; ob_inc="${ob_inc%/}"
  ob_lib="$(pkg-config --variable=libdir openblas)"; ob_lib="${ob_lib%/}"
fi
[ -f "$ob_inc/cblas.h" ] || ob_inc="/usr/include/$multiarch/openblas-pthread"
[ -e "$ob_lib/libopenblas.so" ] || ob_lib="/usr/lib/$multiarch/openblas-pthread"
if [ ! -f "$ob_inc/cblas.h" ] || [ ! -f "$ob_inc/openblas_config.h" ]; then
  die "no OpenBLAS headers in $ob_inc (install libopenblas-dev)"
fi
[ -e "$ob_lib/libopenblas.so" ] || die "no libopenblas.so in $ob_lib (install libopenblas-dev)"
for h in cblas.h openblas_config.h f77blas.h; do
  [ -f "$ob_inc/$h" ] && cp -p "$ob_inc/$h" "$dir/deps/include/$h"
done
owner_pkg "$ob_inc/cblas.h" cblas.h

soname() { readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p'; }
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p'; }
# bundle_so PATH [LINKNAME]: the real file, its SONAME symlink and the link-time name.
bundle_so() {
  local real base so
  real="$(readlink -f "$1")"
  [ -f "$real" ] || die "$1 does not exist"
  base="$(basename "$real")"
  so="$(soname "$real")"
  [ -n "$so" ] || die "$real has no SONAME"
  cp -p "$real" "$dir/deps/lib/$base"
  chmod u+w "$dir/deps/lib/$base"
  owner_pkg "$real" "$base" >/dev/null
  [ "$so" = "$base" ] || ln -sfn "$base" "$dir/deps/lib/$so"
  if [ $# -ge 2 ] && [ "$2" != "$so" ] && [ "$2" != "$base" ]; then
    ln -sfn "$so" "$dir/deps/lib/$2"
  fi
  echo "$so"
}
# Libraries every Linux machine with a C++ compiler has: never bundled.
is_system_lib() {
  case "$1" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libgcc_s.so.*|libstdc++.so.*|linux-vdso*) return 0 ;;
  esac
  return 1
}
# resolve_so SONAME: where the dynamic loader finds it on this machine.
resolve_so() {
  local p
  p="$(/sbin/ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n && /x86-64|x86_64/ {print $NF; exit}')"
  [ -n "$p" ] || for d in "/usr/lib/$multiarch" "/lib/$multiarch" /usr/lib /lib; do
    [ -e "$d/$1" ] && { p="$d/$1"; break; }
  done
  [ -n "$p" ] || die "cannot find $1, a dependency of the bundled libraries"
  echo "$p"
}
# The NEEDED closure (minus the system libraries) of a bundled library.
bundle_closure() {
  local lib="$1" dep
  for dep in $(needed "$lib"); do
    is_system_lib "$dep" && continue
    [ -e "$dir/deps/lib/$dep" ] && continue
    bundle_so "$(resolve_so "$dep")" >/dev/null
    bundle_closure "$dir/deps/lib/$dep"
  done
}
ob_so="$(bundle_so "$ob_lib/libopenblas.so" libopenblas.so)"
bundle_closure "$dir/deps/lib/$ob_so"
z_so="$(bundle_so "$(resolve_so libz.so.1)" libz.so)"
bundle_closure "$dir/deps/lib/$z_so"
# libjpeg-turbo's libjpeg: the image-folder and image-shards readers decode with it.
jpeg_so="$(bundle_so "$(resolve_so libjpeg.so.62)" libjpeg.so)"
bundle_closure "$dir/deps/lib/$jpeg_so"
# libpng: the image readers' PNGs.
png_so="$(bundle_so "$(resolve_so libpng16.so.16)" libpng16.so)"
bundle_closure "$dir/deps/lib/$png_so"
# ---- (d) Open MPI's runtime, relocatable: several ranks on the GPU machine ----------
# Debian's Open MPI 4.1 (openmpi-bin, libopenmpi3, openmpi-common, libpmix2) as
# files, not a package: the launcher (orterun), libmpi and the libraries it
# needs (into deps/lib), the plugins that need no network fabric library (UCX,
# libfabric, verbs, PSM, OpenSHMEM are left out: one node, shared memory and
# TCP), the help texts, mpi.h, and deps/openmpi/bin/mpirun, a script that points
# Open MPI at these folders (OPAL_PREFIX and its OPAL_*DIR variables, which
# Open MPI honours for a moved install) and runs the launcher. The bundle's
# build links this libmpi, so mixtrain there is the multi-process one.
ompi="$dir/deps/openmpi"
rm -rf "$ompi"
mkdir -p "$ompi/bin" "$ompi/lib/openmpi3" "$ompi/lib/pmix" "$ompi/share/openmpi" "$ompi/share/pmix" "$ompi/etc" \
  "$ompi/include/openmpi"
for pkg in openmpi-bin libopenmpi3 openmpi-common libopenmpi-dev libpmix2; do
  dpkg -s "$pkg" >/dev/null 2>&1 || die "package $pkg is not installed (scripts/setup.sh installs Open MPI)"
done
pkg_file() {  # package, file-name pattern (grep -E, anchored at the end): the first such file it installs
  dpkg -L "$1" | grep -E "$2\$" | while read -r f; do [ -f "$f" ] && { echo "$f"; break; }; done
}
orterun="$(pkg_file openmpi-bin '/bin/orterun')"
ob1="$(pkg_file libopenmpi3 '/mca_pml_ob1\.so')"
help="$(pkg_file openmpi-common '/help-mpi-runtime\.txt')"
mpi_h="$(pkg_file libopenmpi-dev '/mpi\.h')"
libmpi="$(pkg_file libopenmpi3 '/libmpi\.so\.[0-9.]*')"
[ -n "$orterun" ] && [ -n "$ob1" ] && [ -n "$help" ] && [ -n "$mpi_h" ] && [ -n "$libmpi" ] ||
  die "cannot find Open MPI's orterun, plugins, help texts, mpi.h or libmpi in the Debian packages"
cp -p "$orterun" "$ompi/bin/orterun"
orted="$(dirname "$orterun")/orted"
[ -f "$orted" ] && cp -p "$orted" "$ompi/bin/orted"
note_pkg openmpi-bin; note_pkg libopenmpi3; note_pkg openmpi-common; note_pkg libpmix2
mpi_so="$(bundle_so "$libmpi" libmpi.so)"
bundle_closure "$dir/deps/lib/$mpi_so"
bundle_closure "$ompi/bin/orterun"
# A plugin is bundled when every library it needs is one Open MPI brings or a
# small one bundled with it: those for network fabrics (and their own plugins)
# would double the bundle, and a single node needs none of them.
fabric='^lib(ucp|ucs|uct|ucm|fabric|ibverbs|rdmacm|psm_infinipath|psm2|nl-[0-9]|nl-route|mca_common_(ucx|ofi|verbs)|oshmem)\.'
n_plugins=0
for f in "$(dirname "$ob1")"/*.so; do
  case "$(basename "$f")" in mca_spml_*|mca_sshmem_*|mca_memheap_*|mca_atomic_*|mca_scoll_*) continue ;; esac
  needed "$f" | grep -qE "$fabric" && continue
  cp -p "$f" "$ompi/lib/openmpi3/"
  bundle_closure "$f"
  n_plugins=$((n_plugins + 1))
done
# PMIx's own plugins and help texts (Open MPI's pmix ext3x plugin loads libpmix).
while IFS= read -r f; do
  case "$f" in
    */pmix/pmix_mca_*.so) [ -f "$f" ] && cp -p "$f" "$ompi/lib/pmix/" && bundle_closure "$f" ;;
    */share/pmix/help-*.txt) cp -p "$f" "$ompi/share/pmix/" ;;
  esac
done < <(dpkg -L libpmix2)
cp -p "$(dirname "$help")"/*.txt "$ompi/share/openmpi/"
# The C API only (mixtrain defines OMPI_SKIP_MPICXX): mpi.h and what it includes.
inc="$(dirname "$mpi_h")"
cp -p "$inc/mpi.h" "$inc/mpi_portable_platform.h" "$ompi/include/"
[ -f "$inc/mpi-ext.h" ] && cp -p "$inc/mpi-ext.h" "$ompi/include/"
[ -d "$inc/openmpi/mpiext" ] && cp -rp "$inc/openmpi/mpiext" "$ompi/include/openmpi/"
cat >"$ompi/etc/openmpi-mca-params.conf" <<'CONF'
# The bundle's Open MPI settings (scripts/gpu_bundle.sh): one node, its ranks
# over shared memory (vader) and TCP; plugins that are not in the bundle are
# neither wanted nor reported; started without ssh (plm isolated: this node only).
btl = self,vader,tcp
pml = ob1
osc = ^ucx,pt2pt
plm = isolated
btl_base_warn_component_unused = 0
mca_base_component_show_load_errors = 0
CONF
cat >"$ompi/env.sh" <<'ENV'
# Source this (bash) to use the bundle's Open MPI: every folder of the moved
# install named (OPAL_PREFIX and the OPAL_*DIR variables Open MPI honours,
# PMIx's plugin path) and the bundle's libraries first on the loader's path.
# bin/mpirun sources it, and the ranks it starts inherit it. A single process
# of a bundle build needs none of it: started without a launcher, it never calls MPI_Init.
ompi="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
deps="$(dirname "$ompi")"
export OPAL_PREFIX="$ompi" OPAL_EXEC_PREFIX="$ompi" OPAL_BINDIR="$ompi/bin" OPAL_SBINDIR="$ompi/bin" \
  OPAL_LIBEXECDIR="$ompi/bin" OPAL_LIBDIR="$deps/lib" OPAL_PKGLIBDIR="$ompi/lib/openmpi3" \
  OPAL_INCLUDEDIR="$ompi/include" OPAL_PKGINCLUDEDIR="$ompi/include/openmpi" \
  OPAL_DATAROOTDIR="$ompi/share" OPAL_DATADIR="$ompi/share" OPAL_PKGDATADIR="$ompi/share/openmpi" \
  OPAL_SYSCONFDIR="$ompi/etc"
export PMIX_INSTALL_PREFIX="$ompi" PMIX_MCA_mca_base_component_path="$ompi/lib/pmix" \
  PMIX_MCA_mca_base_component_show_load_errors=0
# hwloc's plugins (GL, CUDA topology) are not bundled: none from the system either.
export HWLOC_PLUGINS_PATH="$ompi/lib/hwloc"
case ":${LD_LIBRARY_PATH:-}:" in
  *":$deps/lib:"*) ;;
  *) export LD_LIBRARY_PATH="$deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
esac
unset ompi deps
ENV
cat >"$ompi/bin/mpirun" <<'RUN'
#!/usr/bin/env bash
# The bundle's launcher: Open MPI's orterun with the bundle's settings (../env.sh).
# The ranks inherit them. Use it as mpirun, or through mixrun: --mpirun <this file>
# or MIX_MPIRUN=<this file>.
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh"
exec "$OPAL_BINDIR/orterun" "$@"
RUN
chmod +x "$ompi/bin/mpirun"

glibc_needed="$(for lib in "$dir"/deps/lib/*; do [ -L "$lib" ] || readelf -V "$lib"; done \
  | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -1)"

# ---- (e) cuDNN's frontend, packed: fused_attention's cuDNN SDPA path -------------
# Header-only text, carried packed (xz); CMake unpacks it into
# the build folder (CMakeLists.txt). Where setup.sh could not fetch it, the bundle goes
# without and the GPU build runs the op on mixtrain's own kernels.
frontend_dir="${CUDNN_FRONTEND_DIR:-/opt/cudnn-frontend}"
frontend_note="not carried (no $frontend_dir/include/cudnn_frontend.h here): fused_attention runs its own kernels"
if [ -f "$frontend_dir/include/cudnn_frontend.h" ]; then
  tar -C "$frontend_dir" -cJf "$dir/deps/cudnn-frontend.tar.xz" include
  [ -f "$frontend_dir/LICENSE.txt" ] && cp "$frontend_dir/LICENSE.txt" "$dir/deps/licenses/cudnn-frontend.LICENSE.txt"
  echo "cudnn-frontend $(cat "$frontend_dir/VERSION" 2>/dev/null || echo unknown)" >>"$dir/deps/VERSIONS.txt"
  frontend_note="cuDNN frontend $(cat "$frontend_dir/VERSION" 2>/dev/null || echo '?') headers (CMake unpacks them)"
fi

# ---- README --------------------------------------------------------------------
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty=""
[ -z "$(git -C "$root" status --porcelain 2>/dev/null)" ] || dirty=" (plus uncommitted changes)"
cat >"$dir/README.txt" <<EOF
mixtrain GPU bundle
===================
Written by scripts/gpu_bundle.sh on $(date -u +%FT%TZ) from commit $commit$dirty
on $(uname -m) ($(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null)).

What is in it
  src/           the mixtrain sources ($n_src files)
  deps/include/  headers: spdlog, fmt, CLI11, nlohmann-json, Catch2 2.x, OpenBLAS (cblas.h), zlib, libjpeg-turbo, libpng
  deps/lib/      shared libraries: $(find "$dir/deps/lib" -mindepth 1 -printf '%f\n' | sort | tr '\n' ' ')
  deps/openmpi/   Open MPI $(pkg_version libopenmpi3) (Debian's, moved): bin/mpirun (the launcher: orterun
                 with env.sh's settings), env.sh, lib/openmpi3/ ($n_plugins plugins), lib/pmix/, share/, etc/, include/mpi.h
  deps/cudnn-frontend.tar.xz  $frontend_note
  deps/VERSIONS.txt, deps/licenses/   Debian package versions and copyright files

What the GPU machine needs
  Linux x86_64 with glibc >= ${glibc_needed#GLIBC_} (the bundled libraries need it), the NVIDIA
  driver, a CUDA toolkit (nvcc, cuBLAS; NCCL and cuDNN 9 in the toolkit or under
  NCCL_ROOT / CUDNN_ROOT), CMake >= 3.24 and a C++20 host compiler (GCC >= 11).
  Open MPI is not needed there: the bundle carries its own (deps/openmpi), and the
  build links its libmpi (MIX_WITH_MPI is ON by default with this bundle).
  No network access, no other packages.

How to use it
  1. Copy this whole folder to the GPU machine (any path; keep its layout):
       rsync -a $(basename "$dir")/ gpu-node:/scratch/mixbundle/
  2. Run the GPU check from it (builds with CUDA, runs the [cuda] tests, trains the MLP and ResNet-50):
       /scratch/mixbundle/src/scripts/gpu_check.sh --bundle /scratch/mixbundle --out /scratch/gpu_check
     or build by hand:
       cmake -S /scratch/mixbundle/src -B build -DMIX_BUNDLE_DIR=/scratch/mixbundle \\
             -DMIX_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release
       cmake --build build -j
       build/mixtrain --device cuda --data synthetic --steps 100 --eval false
  Several ranks (one per GPU), through the bundle's launcher:
       build/mixrun -n 2 --mpirun /scratch/mixbundle/deps/openmpi/bin/mpirun -- \\
             build/mixtrain --device cuda --data synthetic --steps 100 --eval false
     or /scratch/mixbundle/deps/openmpi/bin/mpirun --allow-run-as-root -n 2 build/mixtrain ...
     (it is Open MPI's mpirun: -n, -x VAR, --oversubscribe as usual; one node only, no ssh).
     gpu_check.sh uses it for its several-GPU rows (they run with 2+ GPUs). A single
     process started without it needs no environment (no MPI_Init). To run Open MPI's
     tools by hand, first: source /scratch/mixbundle/deps/openmpi/env.sh
  Pass MIX_BUNDLE_DIR as an absolute path. With -DMIX_BUNDLE_DIR every non-CUDA
  dependency (spdlog, fmt, CLI11, nlohmann-json, Catch2, OpenBLAS, zlib, libjpeg-turbo, libpng) comes from
  deps/ only; spdlog and fmt are used header-only. The programs carry an RPATH to
  deps/lib, so they run without LD_LIBRARY_PATH -- do not move the bundle after
  building (or rebuild / set LD_LIBRARY_PATH=<bundle>/deps/lib if you do).
EOF

size=$(du -sb "$dir" | cut -f1)
echo "gpu_bundle: wrote $dir ($size bytes: src $(du -sb "$dir/src" | cut -f1), deps $(du -sb "$dir/deps" | cut -f1); $n_src source files)"
[ "$size" -lt "$limit" ] || die "the bundle is $size bytes, over the $limit-byte limit"
