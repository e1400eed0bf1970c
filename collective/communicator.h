#pragma once
// The one communicator interface. Callers never ask which backend they hold:
// MPI (host buffers, multi-process), local (one process, world size 1) and
// NCCL (device buffers; collective/nccl_communicator.cu) all implement it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "runtime/core/dtype.h"

namespace mix::collective {

enum class ReduceOp { sum, max, avg };

/// --collective-timeout's default: long enough for a slow first step (cuDNN's
/// algorithm search, a checkpoint being written by rank 0 while the others
/// wait in the barrier after it), short enough that a stuck job ends the same hour.
inline constexpr double kDefaultCollectiveTimeoutS = 600;
/// Exit status of a job a collective timeout ended (as timeout(1)'s).
inline constexpr int kCollectiveTimeoutExitCode = 124;
std::string_view reduce_op_name(ReduceOp op);

/// Bytes handed to collectives, split by purpose, so that metrics can report
/// what gradient sync moved separately from control traffic (found_inf, checks).
struct ByteCounters {
  uint64_t grad_allreduce_bytes = 0;  ///< payload of gradient all-reduces (count * dtype size)
  uint64_t other_bytes = 0;           ///< every other collective's payload
  uint64_t grad_allreduce_calls = 0;
};

enum class Traffic { gradients, control };

/// A collective in flight: all_reduce_start returns it, wait completes it.
using Request = uint64_t;

/// One buffer of Communicator::broadcast_many.
struct ByteSpan {
  void* data = nullptr;
  size_t bytes = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// Rank among the processes on this host (MPI_Comm_split_type SHARED).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  virtual std::string backend_name() const = 0;

  /// In-place all-reduce of `count` elements of `dtype` at `buf`.
  /// f16/bf16 sums add in FP32 and round to 16 bits at every hop, as a GPU ring does.
  /// avg is the sum followed by a multiply by 1/world (rounded to the dtype).
  virtual void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Traffic traffic = Traffic::control) = 0;
  /// Out-of-place all-reduce: recv = the reduction over ranks of every rank's
  /// send (both `count` elements, on the communicator's device; send == recv is
  /// the in-place form). Benchmarks time both forms, as nccl-tests does.
  virtual void all_reduce_into(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                               Traffic traffic = Traffic::control) = 0;
  /// Starts an in-place all-reduce and returns at once, so that backward can go
  /// on while the bytes travel (MPI: MPI_Iallreduce; NCCL: queued on the
  /// communication stream after the compute stream's work so far). `buf` must
  /// be left alone until wait(). Every rank starts the same all-reduces in the
  /// same order. This base version runs the blocking all_reduce: correct for a
  /// backend without non-blocking collectives, with nothing to overlap.
  virtual Request all_reduce_start(void* buf, size_t count, DType dtype, ReduceOp op,
                                   Traffic traffic = Traffic::control);
  /// Completes a started all-reduce. Host backends return when `buf` holds the
  /// result; device backends return at once, having made the compute stream
  /// wait (on the device) for the result, so work queued after it sees it.
  /// Throws naming the request when it is unknown or already waited for.
  virtual void wait(Request request);
  /// Gives up a started all-reduce without its result: one started while a
  /// device graph was being recorded (DeviceGraph::record) that then failed,
  /// before the step's wait for it (its buffer may be gone already). NCCL's
  /// went into the recording and nowhere else. This base version's starts are
  /// complete already; MPI refuses (only device steps are recorded, and its
  /// started collectives are real).
  virtual void forget(Request request) { wait(request); }
  /// Lets in-flight collectives advance; the executor calls it between ops.
  /// MPI moves non-blocking collectives only inside MPI calls, so without it a
  /// started all-reduce would mostly run in wait(). Cheap when nothing is in flight.
  virtual void progress() {}
  /// Started and not yet waited for.
  virtual size_t in_flight() const { return started_.size(); }
  /// Returns when the work this rank has queued has finished: on a device
  /// backend, the compute stream's kernels so far and every collective on the
  /// communication stream (started ones included), awaited with the same
  /// watchdog as a blocking collective, so a dead or stuck peer ends in a
  /// timeout and an abort instead of a hang. A step that only starts and waits
  /// for collectives (FP32 on GPUs) calls it once at its end; so do timings.
  /// Host backends finish each call before returning: nothing to do (a started
  /// all-reduce still needs its wait()).
  virtual void synchronize() {}

  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  /// broadcast of several buffers as one operation, as DDP coalesces its buffer
  /// broadcast (ResNet-50 has about 100 batch-norm statistics, sent every step).
  /// The MPI backend sends them packed in one message; NCCL launches them as one
  /// group and waits once. Byte counters move by the total. This base version
  /// broadcasts each in turn.
  virtual void broadcast_many(const std::vector<ByteSpan>& buffers, int root);
  /// Gathers `bytes_per_rank` bytes from every rank into recv (world * bytes_per_rank), rank order.
  virtual void all_gather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  virtual void barrier() = 0;
  /// Ends every process of the job (a dead or failing rank must not leave others hanging).
  [[noreturn]] virtual void abort(int exit_code) = 0;

  const ByteCounters& bytes() const { return bytes_; }
  void reset_bytes() { bytes_ = {}; }

  /// Seconds a collective may wait for the other ranks before this rank
  /// reports what it waits in and for whom, and ends the job
  /// (--collective-timeout). The MPI backend keeps it (default
  /// kDefaultCollectiveTimeoutS); the others ignore it (NCCL has its own
  /// watchdog, set from the same flag).
  virtual void set_timeout(double /*seconds*/) {}
  /// The training step the caller is in, for that report (0: before training).
  void set_step(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

 protected:
  void count(size_t payload_bytes, Traffic traffic);
  /// A fresh request id, for backends that keep their own in-flight tables.
  Request next_request() { return ++last_request_; }
  ByteCounters bytes_;

 private:
  Request last_request_ = 0;
  int64_t step_ = 0;
  std::unordered_set<Request> started_;  // the base version's requests (already complete)
};

/// The world-size-1 backend: every collective is the identity.
std::unique_ptr<Communicator> make_local_communicator();
/// MPI backend over MPI_COMM_WORLD; calls MPI_Init_thread if needed. Throws if
/// this build has no MPI.
std::unique_ptr<Communicator> make_mpi_communicator();
/// True when this process was started by mpirun/mpiexec (Open MPI, PMIx, MPICH, Slurm PMI env).
bool launched_under_mpi();
/// MPI when launched under MPI, else local.
std::unique_ptr<Communicator> make_default_communicator();

/// A backend that had to leave a thread behind inside a library call it could
/// not end (ncclCommAbort past its timeout, with GPU work stuck) says so here.
/// The process must then end without static destructors and library teardown,
/// which would race that thread into a crash or a hang at exit: run_worker
/// (launch/worker_main.h) ends it with std::_Exit.
void note_thread_left_in_library() noexcept;
bool thread_left_in_library() noexcept;

/// A communicator for DEVICE buffers (NCCL), bootstrapped over a host
/// communicator; the CUDA backend registers the factory, so callers need no
/// #ifdef. `device` is the GPU this rank drives.
using DeviceCommunicatorFactory = std::unique_ptr<Communicator> (*)(Communicator& bootstrap, int device);
void register_device_communicator_factory(DeviceCommunicatorFactory f);
/// Throws mix::Error when this build has no device communicator.
std::unique_ptr<Communicator> make_device_communicator(Communicator& bootstrap, int device);
/// Picks this rank's GPU from its local rank and checks the binding (no two
/// ranks on one GPU, no more local ranks than GPUs); the CUDA backend registers it.
using DeviceBinder = int (*)(Communicator& bootstrap);
void register_device_binder(DeviceBinder f);
int bind_device(Communicator& bootstrap);

/// Elementwise reduction of `in` into `inout` with the communicator's
/// semantics (f16/bf16: FP32 add, round per hop). Shared by the MPI user-defined
/// op and by tests that compute expected results.
void reduce_into(void* inout, const void* in, size_t count, DType dtype, ReduceOp op);

}  // namespace mix::collective
