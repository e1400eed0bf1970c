#pragma once
// The NCCL backend of the one communicator interface (communicator.h), for
// DEVICE buffers. Built only with CUDA (collective/nccl_communicator.cu, in
// mix_cuda); callers normally reach it through make_device_communicator(),
// which it registers itself with, and need no #ifdef.
//
// Semantics, as seen by a caller of Communicator:
// - Every buffer is device memory (cudaMalloc or managed) of `device`; a host
//   pointer is refused with a message instead of crashing inside NCCL.
// - Collectives run on the device's communication stream
//   (mix::cuda::context(device).comm). Before launching, that stream is made to
//   wait (on the device, no host sync) for the work already queued on the
//   compute stream, so a buffer written by the step's kernels is complete when
//   NCCL reads it. Buffers written on any other stream must be complete first.
// - Every call but all_reduce_start/wait returns only when the collective has
//   completed (the host waits for the communication stream), so the result may
//   be used on any stream and the buffer freed or reused at once.
// - all_reduce_start (overlap of gradient all-reduces with backward): the same
//   checks and byte counting as all_reduce, the communication stream waits for
//   the compute stream as above, then ncclAllReduce is queued in place and, once
//   NCCL has enqueued it (polled with the watchdog when the launch returns
//   ncclInProgress), an event is recorded on the communication stream after it.
//   It returns at once, without waiting for the stream; the request id names
//   that event. The buffer must not be touched, nor freed, until wait().
//   wait(id): the compute stream waits for the event on the device (no host
//   sync), so work queued on it afterwards sees the result (and the caching
//   allocator may hand the buffer out again, as its blocks are ordered on the
//   compute stream); then one non-blocking ncclCommGetAsyncError. An unknown or
//   already waited-for id throws naming it. Work on other streams must order
//   itself after the compute stream. progress() only looks for asynchronous
//   NCCL errors; in_flight() counts the started, not waited-for requests.
//   No watchdog runs for a started collective by itself: the next blocking
//   collective, or synchronize() (the end of every training step), awaits the
//   FIFO communication stream, hence every collective started before it, with
//   the timeout and abort below.
// - synchronize(): the communication stream waits for the compute stream, then
//   the host awaits the communication stream with the watchdog: everything this
//   rank queued before the call has finished, or the communicator is aborted. Requests never waited for are dropped
//   (their events destroyed, never throwing) when the communicator is aborted or destroyed.
// - all_reduce, all_reduce_start: f16 (ncclFloat16), bf16 (ncclBfloat16), f32, i32, i64, u8; sum, max
//   and avg (ncclAvg). NCCL adds 16-bit values per hop like the MPI backend,
//   but its avg of floating types multiplies every input by 1/world before the
//   sum (integers: sum, then divide), so for world > 1 an f16/bf16/f32 avg may
//   differ from the MPI backend's sum-then-scale in the last bit. Gradient
//   buckets use sum with explicit pre/post scaling (allreduce_op) anyway.
// - rank/world/local rank come from the bootstrap communicator, which must
//   outlive this one; byte counters count payloads as the MPI backend does.
//
// Failure handling (no rank hangs forever):
// - The communicator is non-blocking (ncclConfig_t::blocking = 0): init and
//   every launch return at once, and this code polls. After each blocking launch it
//   polls cudaStreamQuery (completion) and ncclCommGetAsyncError (network and
//   peer failures) until the collective completes, an error appears, or the
//   timeout passes: MIX_NCCL_TIMEOUT_S seconds (default 300, fractions allowed;
//   mixtrain sets it from --collective-timeout, default 600)
//   per call; ncclCommInitRank gets at least 60 s (NCCL's set-up takes seconds
//   on a large node, and a short timeout meant for stuck collectives must not
//   fail a healthy start).
// - On an error or a timeout the NCCL communicator is aborted (ncclCommAbort,
//   which also ends NCCL kernels still running; on a helper thread, given the
//   same timeout, since it may wait for the device), and mix::Error is thrown naming
//   the rank, the host, the GPU, the operation and its size, what NCCL said, and
//   what to check (the other ranks' logs, NCCL_DEBUG=INFO, MIX_NCCL_TIMEOUT_S).
//   Every later call throws at once, naming that first failure. mixtrain's
//   main then calls abort(), which ends the whole job through the bootstrap.
// - The same timeout bounds the device allocator's wait for queued work before
//   it returns its cache on out of memory (cuda::set_hang_timeout).
// - abort(code): ncclCommAbort (if not yet aborted; bounded in the same way),
//   then bootstrap.abort(code).
// - Destructor (never throws): ncclCommFinalize polled with the same timeout,
//   then ncclCommDestroy; after a failure, or while an exception is unwinding
//   (peers may be gone, so a finalize could wait on them), ncclCommAbort instead.
#include <memory>

#include "collective/communicator.h"

namespace mix::collective {

/// NCCL communicator of all ranks of `bootstrap`, this rank driving GPU `device`
/// (see bind_local_gpu). Collective over `bootstrap`: every rank calls it.
/// Rank 0 makes the ncclUniqueId, `bootstrap` broadcasts it, every rank calls
/// ncclCommInitRank on `device`. Throws mix::Error on failure or timeout.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device);

/// Seconds one NCCL call may take before the communicator is aborted:
/// MIX_NCCL_TIMEOUT_S, default 300, at most 1e9 (larger values are clamped:
/// deadlines in steady_clock nanoseconds would overflow). Throws mix::Error on a value that is not a
/// positive number.
double nccl_timeout_seconds();

}  // namespace mix::collective
