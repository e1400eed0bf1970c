#pragma once
// The MPI backend's one knob beyond communicator.h, for tests: a smaller
// per-call size makes ordinary buffers take the chunked paths that keep every
// MPI count within an int on huge buffers. Built only with MPI.
#include <cstddef>
#include <memory>

#include "collective/communicator.h"

namespace mix::collective {

/// Default bytes one MPI call moves; larger collectives are split into calls of this size.
inline constexpr size_t kMpiMaxBytesPerCall = size_t{1} << 30;

/// make_mpi_communicator() with each MPI call moving at most `max_bytes_per_call`
/// bytes (at least one element). Several may live at once; MPI is finalized
/// with the last of them, and only if one of them initialised it.
std::unique_ptr<Communicator> make_mpi_communicator(size_t max_bytes_per_call);

}  // namespace mix::collective
