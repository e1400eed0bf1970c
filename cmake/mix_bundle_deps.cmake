# Bundle mode (-DMIX_BUNDLE_DIR=DIR, DIR written by scripts/gpu_bundle.sh): every
# non-CUDA dependency comes from DIR/deps ONLY -- no find_package, no pkg-config.
# The targets have the names the rest of the build uses with the Debian packages:
#   spdlog::spdlog (header-only, with fmt::fmt-header-only), CLI11::CLI11,
#   nlohmann_json::nlohmann_json, Catch2::Catch2, ZLIB::ZLIB, PkgConfig::OPENBLAS.
# Threads (and CUDA, when on) still come from the system. Included from the
# "dependencies" section of the top-level CMakeLists.txt.

if(NOT IS_ABSOLUTE "${MIX_BUNDLE_DIR}")
  message(FATAL_ERROR "MIX_BUNDLE_DIR must be an absolute path (got '${MIX_BUNDLE_DIR}')")
endif()
set(MIX_BUNDLE_INCLUDE "${MIX_BUNDLE_DIR}/deps/include")
set(MIX_BUNDLE_LIB "${MIX_BUNDLE_DIR}/deps/lib")

foreach(f spdlog/spdlog.h spdlog/spdlog-inl.h fmt/format.h fmt/format-inl.h CLI/CLI.hpp
          nlohmann/json.hpp catch2/catch.hpp cblas.h openblas_config.h zlib.h zconf.h)
  if(NOT EXISTS "${MIX_BUNDLE_INCLUDE}/${f}")
    message(FATAL_ERROR "MIX_BUNDLE_DIR=${MIX_BUNDLE_DIR} is not a mixtrain bundle: "
      "${MIX_BUNDLE_INCLUDE}/${f} is missing (write one with scripts/gpu_bundle.sh DIR)")
  endif()
endforeach()
foreach(f libopenblas.so.0 libz.so.1)
  if(NOT EXISTS "${MIX_BUNDLE_LIB}/${f}")
    message(FATAL_ERROR "MIX_BUNDLE_DIR=${MIX_BUNDLE_DIR} is not a mixtrain bundle: "
      "${MIX_BUNDLE_LIB}/${f} is missing (write one with scripts/gpu_bundle.sh DIR)")
  endif()
endforeach()

# mix_bundle_header_target(NAME [DEFINITIONS...] [LINK target...])
function(mix_bundle_header_target name)
  cmake_parse_arguments(B "" "" "DEFINITIONS;LINK" ${ARGN})
  add_library(${name} INTERFACE IMPORTED GLOBAL)
  set_target_properties(${name} PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${MIX_BUNDLE_INCLUDE}"
    INTERFACE_COMPILE_DEFINITIONS "${B_DEFINITIONS}"
    INTERFACE_LINK_LIBRARIES "${B_LINK}")
endfunction()

# fmt 9 (Debian) supports FMT_HEADER_ONLY: fmt/format.h then includes format-inl.h.
mix_bundle_header_target(fmt::fmt-header-only DEFINITIONS FMT_HEADER_ONLY=1)
# spdlog 1.10 without SPDLOG_COMPILED_LIB is header-only (its -inl.h files are in the
# bundle). SPDLOG_HEADER_ONLY is defined empty and SPDLOG_FMT_EXTERNAL as 1, exactly
# as spdlog/common.h and Debian's tweakme.h define them, so the redefinitions are silent.
mix_bundle_header_target(spdlog::spdlog
  DEFINITIONS SPDLOG_HEADER_ONLY= SPDLOG_FMT_EXTERNAL=1
  LINK fmt::fmt-header-only Threads::Threads)
mix_bundle_header_target(CLI11::CLI11)
mix_bundle_header_target(nlohmann_json::nlohmann_json)
# Catch2 2.x single header; tests/CMakeLists.txt only calls find_package(Catch2)
# when this target does not exist yet.
mix_bundle_header_target(Catch2::Catch2)

# Shared libraries, linked by full path. The SONAME symlinks are what the programs
# record (NEEDED libopenblas.so.0 / libz.so.1).
add_library(ZLIB::ZLIB SHARED IMPORTED GLOBAL)
set_target_properties(ZLIB::ZLIB PROPERTIES
  IMPORTED_LOCATION "${MIX_BUNDLE_LIB}/libz.so.1"
  IMPORTED_SONAME libz.so.1
  INTERFACE_INCLUDE_DIRECTORIES "${MIX_BUNDLE_INCLUDE}")
add_library(PkgConfig::OPENBLAS SHARED IMPORTED GLOBAL)
set_target_properties(PkgConfig::OPENBLAS PROPERTIES
  IMPORTED_LOCATION "${MIX_BUNDLE_LIB}/libopenblas.so.0"
  IMPORTED_SONAME libopenblas.so.0
  INTERFACE_INCLUDE_DIRECTORIES "${MIX_BUNDLE_INCLUDE}"
  INTERFACE_LINK_LIBRARIES Threads::Threads
  # libopenblas needs libgfortran.so.5 (and libquadmath), which the bundle also
  # carries. A DT_RUNPATH of the program would only serve its direct dependencies;
  # DT_RPATH (old dtags) is searched for the dependencies of libopenblas too, so
  # a node without libgfortran still loads everything from deps/lib.
  INTERFACE_LINK_OPTIONS "LINKER:--disable-new-dtags")
set(ZLIB_FOUND TRUE)
set(ZLIB_INCLUDE_DIRS "${MIX_BUNDLE_INCLUDE}")
set(ZLIB_LIBRARIES ZLIB::ZLIB)
set(OPENBLAS_FOUND TRUE)

# Run-time search path: the build tree's programs (and installed ones) find the
# bundled .so files without LD_LIBRARY_PATH. CMake adds the folder of libraries
# linked by full path to the build RPATH anyway; this makes it explicit and also
# covers the link step (ld looks for libgfortran.so.5 along -rpath).
list(APPEND CMAKE_BUILD_RPATH "${MIX_BUNDLE_LIB}")
list(APPEND CMAKE_INSTALL_RPATH "${MIX_BUNDLE_LIB}")

# MPI: the bundle's Open MPI (deps/openmpi/include/mpi.h, deps/lib/libmpi.so.40;
# deps/openmpi/bin/mpirun starts the ranks), else the machine's, else none (the
# single-process mixtrain).
set(MIX_BUNDLE_MPI "${MIX_BUNDLE_DIR}/deps/openmpi")
if(MIX_WITH_MPI AND EXISTS "${MIX_BUNDLE_MPI}/include/mpi.h" AND EXISTS "${MIX_BUNDLE_LIB}/libmpi.so.40")
  add_library(MPI::MPI_C SHARED IMPORTED GLOBAL)
  set_target_properties(MPI::MPI_C PROPERTIES
    IMPORTED_LOCATION "${MIX_BUNDLE_LIB}/libmpi.so.40"
    IMPORTED_SONAME libmpi.so.40
    INTERFACE_INCLUDE_DIRECTORIES "${MIX_BUNDLE_MPI}/include"
    # The C API only: no C++ bindings (libmpi_cxx is not bundled).
    INTERFACE_COMPILE_DEFINITIONS OMPI_SKIP_MPICXX=1
    INTERFACE_LINK_OPTIONS "LINKER:--disable-new-dtags")
  # Debian's libmpi and libopen-rte carry a DT_RUNPATH (/usr/lib/<arch>/openmpi/lib),
  # and a library with one ignores the program's DT_RPATH for its own
  # dependencies: on a machine without Open MPI the loader would not find
  # libopen-pal. Linked directly (kept with --no-as-needed), they are loaded
  # through the program's RPATH first, and libmpi then finds them by SONAME.
  # So a single process (no MPI_Init) runs with no environment at all; several
  # ranks start through deps/openmpi/bin/mpirun, which sets the rest.
  set(mix_mpi_deps "")
  foreach(so libopen-rte.so.40 libopen-pal.so.40 libhwloc.so.15 libevent_core-2.1.so.7 libevent_pthreads-2.1.so.7)
    if(EXISTS "${MIX_BUNDLE_LIB}/${so}")
      list(APPEND mix_mpi_deps "${MIX_BUNDLE_LIB}/${so}")
    endif()
  endforeach()
  set_target_properties(MPI::MPI_C PROPERTIES
    INTERFACE_LINK_LIBRARIES "-Wl,--push-state,--no-as-needed;${mix_mpi_deps};-Wl,--pop-state")
  set(MPI_C_FOUND TRUE)
  message(STATUS "mixtrain: MPI from the bundle (Open MPI in ${MIX_BUNDLE_MPI}; start ranks with its bin/mpirun)")
elseif(MIX_WITH_MPI)
  find_package(MPI QUIET COMPONENTS C)
  if(NOT MPI_C_FOUND)
    message(STATUS "mixtrain: bundle mode and no MPI in the bundle or on this machine: MIX_WITH_MPI OFF (single process)")
    set(MIX_WITH_MPI OFF)
  endif()
endif()
message(STATUS "mixtrain: dependencies from the bundle ${MIX_BUNDLE_DIR}/deps (spdlog/fmt header-only)")
