// The NCCL backend (device buffers). Host code only: NCCL brings its own
// kernels. See nccl_communicator.h for the semantics and the failure handling.
//
// Every collective is launched on a non-blocking communicator and then awaited
// by polling (`await`): cudaStreamQuery for completion, ncclCommGetAsyncError
// for failures NCCL sees off the stream (a dead peer, a network error), and a
// deadline. A blocking cudaStreamSynchronize would wait forever on a collective
// that a dead rank never joins; the poll loop is that synchronize with a way out.
//
// all_reduce_start is the exception: it polls only until NCCL has enqueued the
// collective, records an event on the communication stream after it and
// returns; wait() makes the compute stream wait for that event on the device.
// Neither waits for the stream on the host, so no watchdog runs for the started
// collectives themselves. The next blocking collective or synchronize() does it
// for them: the communication stream is FIFO, so awaiting it (the synchronize
// that ends every training step) awaits every collective started before it,
// with the same deadline and abort on failure.
#include "collective/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "collective/nccl_check.h"
#include "runtime/core/check.h"
#include "runtime/core/library_versions.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"

// Non-blocking communicators and ncclCommFinalize came with 2.14; ncclAvg and
// ncclBfloat16 with 2.10.
#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "mixtrain needs NCCL 2.14 or newer (non-blocking communicators); point NCCL_ROOT at a newer NCCL"
#endif

namespace mix::collective {

namespace {

constexpr double kDefaultTimeoutS = 300.0;
constexpr double kMaxTimeoutS = 1e9;  // larger values are clamped (nccl_timeout_seconds)
// ncclCommInitRank waits at least this long, whatever MIX_NCCL_TIMEOUT_S says:
// NCCL's own set-up (topology and NVLink/NVLS detection, proxy threads, device
// buffers) takes seconds on a large node and more across many, and a short
// timeout meant for stuck collectives must not fail a healthy start.
constexpr double kMinInitTimeoutS = 60.0;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  MIX_FAIL("NCCL all_reduce: unsupported dtype " << static_cast<int>(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::avg: return ncclAvg;
  }
  MIX_FAIL("NCCL all_reduce: unsupported reduction " << static_cast<int>(op));
}

std::string format_seconds(double s) {
  std::ostringstream o;
  o << s << " s";
  return o.str();
}

// Polling pauses: yield for the first 20 ms, then sleep, growing to 200 us,
// so that a long wait (a large all-reduce, a stuck peer) costs no CPU.
// The wait at the end of a training step is the common one: an AMP step on a
// fast GPU takes tens of milliseconds, and a sleep overshoots its end by a
// sleep plus the kernel's timer slack (0.1-0.3 ms), a percent of such a step,
// where yielding notices the end within microseconds. CUDA's own default
// (spin, then yield) spends a core on waiting the same way.
class Backoff {
 public:
  void pause(std::chrono::steady_clock::duration waited) {
    using namespace std::chrono;
    if (waited < milliseconds(20)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, microseconds(200));
  }

 private:
  std::chrono::microseconds sleep_{10};
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device)
      : bootstrap_(bootstrap),
        device_(device),
        rank_(bootstrap.rank()),
        world_(bootstrap.world_size()),
        local_rank_(bootstrap.local_rank()),
        local_size_(bootstrap.local_size()),
        timeout_s_(nccl_timeout_seconds()) {
    const int visible = cuda::device_count();
    if (device < 0 || device >= visible) {
      MIX_FAIL("NCCL communicator: GPU " << device << " requested on " << process_identity() << " but " << visible
                                         << " GPU(s) are visible (check CUDA_VISIBLE_DEVICES and nvidia-smi)");
    }
    try {
      MIX_CUDA_CHECK(cudaSetDevice(device_));
      ctx_ = &cuda::context(device_);
      // Host waits outside this communicator (the allocator's out-of-memory
      // retry) give up after the same time rather than hang on a dead peer.
      cuda::set_hang_timeout(timeout_s_);
      compute_done_ = std::make_unique<cuda::Event>();
      MIX_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(int32_t)));
      // On the compute stream, which prepare() orders every collective after
      // (a plain cudaMemset runs on the legacy stream, unordered with ours).
      MIX_CUDA_CHECK(cudaMemsetAsync(barrier_buf_, 0, sizeof(int32_t), ctx_->compute.get()));
      init_nccl();
    } catch (...) {
      release(/*graceful=*/false);
      throw;
    }
  }

  ~NcclCommunicator() override {
    // After a failure, or while an exception unwinds (other ranks may be gone or
    // stuck), finalizing could wait on peers: abort instead.
    release(/*graceful=*/failure_.empty() && std::uncaught_exceptions() == 0);
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend_name() const override { return "nccl"; }

  void all_reduce(void* buf, size_t n, DType dtype, ReduceOp op, Traffic traffic) override {
    all_reduce_into(buf, buf, n, dtype, op, traffic);
  }

  void all_reduce_into(const void* send, void* buf, size_t n, DType dtype, ReduceOp op, Traffic traffic) override {
    const auto what = [&] {
      return MIX_STR_CAT("all_reduce (" << reduce_op_name(op) << " of " << n << " " << dtype_name(dtype) << " = "
                                        << n * dtype_size(dtype) << " bytes)");
    };
    MIX_CHECK((buf != nullptr && send != nullptr) || n == 0, "NCCL " << what() << " got a null buffer");
    const ncclDataType_t type = nccl_type(dtype);
    const ncclRedOp_t nop = nccl_op(op);
    check_alive(what);
    if (n == 0) {
      count(0, traffic);
      return;
    }
    check_device_buffer(buf, "buffer", what);
    if (send != buf) check_device_buffer(send, "send buffer", what);
    count(n * dtype_size(dtype), traffic);
    prepare(what);
    launch_and_wait(what, ncclAllReduce(send, buf, n, type, nop, comm_, stream()));
  }

  Request all_reduce_start(void* buf, size_t n, DType dtype, ReduceOp op, Traffic traffic) override {
    const auto what = [&] {
      return MIX_STR_CAT("all_reduce_start (" << reduce_op_name(op) << " of " << n << " " << dtype_name(dtype) << " = "
                                              << n * dtype_size(dtype) << " bytes)");
    };
    MIX_CHECK(buf != nullptr || n == 0, "NCCL " << what() << " got a null buffer");
    const ncclDataType_t type = nccl_type(dtype);
    const ncclRedOp_t nop = nccl_op(op);
    check_alive(what);
    if (n == 0) {
      count(0, traffic);
      const Request id = next_request();
      pending_.emplace(id, nullptr);  // nothing to wait for
      return id;
    }
    check_device_buffer(buf, "buffer", what);
    const Request id = next_request();
    count(n * dtype_size(dtype), traffic);
    prepare(what);
    const ncclResult_t rc = ncclAllReduce(buf, buf, n, type, nop, comm_, stream());
    if (rc != ncclSuccess && rc != ncclInProgress) fail(what(), nccl_error_text(rc, comm_));
    // Non-blocking communicator: ncclInProgress means the collective is not on
    // the stream yet, and nothing may be queued on the stream (the event below)
    // until it is. Poll for that only (the watchdog, without the stream).
    if (rc == ncclInProgress) await(what, /*stream_work=*/false, timeout_s_);
    std::unique_ptr<cuda::Event> done = take_event();
    done->record(stream());
    pending_.emplace(id, std::move(done));
    return id;
  }

  void wait(Request request) override {
    const auto what = [&] { return MIX_STR_CAT("wait for all-reduce request " << request); };
    // After an abort every wait names the first failure (the started collectives
    // were ended with the communicator; their buffers hold no result).
    check_alive(what);
    auto it = pending_.find(request);
    if (it == pending_.end()) {
      MIX_FAIL("NCCL " << what() << " on " << process_identity() << ": the communicator has no such request in "
                       << "flight (never started, or already waited for); " << pending_.size()
                       << " request(s) in flight");
    }
    std::unique_ptr<cuda::Event> done = std::move(it->second);
    pending_.erase(it);
    if (done) {
      MIX_CUDA_CHECK(cudaSetDevice(device_));
      // On the device: kernels queued on the compute stream after this run once
      // the collective has completed; the host goes on at once.
      done->wait(ctx_->compute.get());
      spare_events_.push_back(std::move(done));  // safe to re-record: the wait above has captured it
    }
    check_async_error(what);
  }

  // Only the recording holds the all-reduce, and its event was last recorded
  // while capturing (CUDA refuses to wait on such an event): both go.
  void forget(Request request) override {
    const auto what = [&] { return MIX_STR_CAT("forget all-reduce request " << request); };
    // After an abort (a failure seen while recording) the first failure is
    // the news, not a request the abort already dropped.
    check_alive(what);
    MIX_CHECK(pending_.erase(request) == 1,
              "NCCL " << what() << " on " << process_identity() << ": no such request in flight");
  }

  // A non-blocking look for failures NCCL has seen off the stream (a dead
  // peer, a network error), so that they surface between ops rather than at
  // the next blocking collective. Nothing when no collective is in flight.
  void progress() override {
    if (pending_.empty() || !comm_) return;
    const auto what = [&] { return MIX_STR_CAT(pending_.size() << " started all-reduce(s)"); };
    check_async_error(what);
  }

  size_t in_flight() const override { return pending_.size(); }

  // The communication stream waits (on the device) for the compute stream's
  // work so far; awaiting that stream then awaits both, with the watchdog.
  void synchronize() override {
    const auto what = [&] {
      return MIX_STR_CAT("synchronize (the compute stream's work and " << pending_.size()
                                                                       << " started all-reduce(s) not yet waited for)");
    };
    prepare(what);
    await(what, /*stream_work=*/true, timeout_s_);
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    const auto what = [&] { return MIX_STR_CAT("broadcast (" << bytes << " bytes from rank " << root << ")"); };
    MIX_CHECK(root >= 0 && root < world_, "NCCL broadcast root " << root << " is not a rank of a world of size " << world_);
    MIX_CHECK(buf != nullptr || bytes == 0, "NCCL " << what() << " got a null buffer");
    check_alive(what);
    if (bytes == 0) return;
    check_device_buffer(buf, "buffer", what);
    count(bytes, Traffic::control);
    prepare(what);
    launch_and_wait(what, ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream()));
  }

  // One NCCL group: every broadcast is launched, then the host waits once.
  void broadcast_many(const std::vector<ByteSpan>& buffers, int root) override {
    size_t total = 0;
    for (const ByteSpan& b : buffers) total += b.bytes;
    const auto what = [&] {
      return MIX_STR_CAT("broadcast_many (" << buffers.size() << " buffers, " << total << " bytes from rank " << root
                                            << ")");
    };
    MIX_CHECK(root >= 0 && root < world_,
              "NCCL broadcast root " << root << " is not a rank of a world of size " << world_);
    check_alive(what);
    for (const ByteSpan& b : buffers) {
      MIX_CHECK(b.data != nullptr || b.bytes == 0, "NCCL " << what() << " got a null buffer");
      if (b.bytes) check_device_buffer(b.data, "buffer", what);
    }
    if (total == 0) return;
    count(total, Traffic::control);
    prepare(what);
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) fail(what(), "ncclGroupStart: " + nccl_error_text(rc, comm_));
    for (const ByteSpan& b : buffers) {
      if (b.bytes == 0) continue;
      rc = ncclBroadcast(b.data, b.data, b.bytes, ncclUint8, root, comm_, stream());
      if (rc != ncclSuccess && rc != ncclInProgress) {
        (void)ncclGroupEnd();
        fail(what(), nccl_error_text(rc, comm_));
      }
    }
    launch_and_wait(what, ncclGroupEnd());
  }

  void all_gather(const void* send, void* recv, size_t bytes_per_rank) override {
    const auto what = [&] { return MIX_STR_CAT("all_gather (" << bytes_per_rank << " bytes per rank)"); };
    MIX_CHECK((send != nullptr && recv != nullptr) || bytes_per_rank == 0, "NCCL " << what() << " got a null buffer");
    check_alive(what);
    if (bytes_per_rank == 0) return;
    check_device_buffer(send, "send buffer", what);
    check_device_buffer(recv, "receive buffer", what);
    count(bytes_per_rank, Traffic::control);
    prepare(what);
    // A send buffer at recv + rank * bytes_per_rank is NCCL's in-place form; any
    // other overlap is the caller's error, as with MPI.
    launch_and_wait(what, ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm_, stream()));
  }

  // An all-reduce of one int on the device: it also proves the NCCL path works.
  // Not counted, like the MPI backend's barrier.
  void barrier() override {
    const auto what = [] { return std::string("barrier (all_reduce of one int32)"); };
    prepare(what);
    launch_and_wait(what, ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, stream()));
  }

  [[noreturn]] void abort(int exit_code) override {
    // Then the bootstrap ends every process, this one and its GPU work included,
    // whether or not ncclCommAbort returned.
    if (!abort_nccl())
      std::fprintf(stderr, "%s: ncclCommAbort did not return within %s; ending the job without it\n",
                   process_identity().c_str(), format_seconds(timeout_s_).c_str());
    bootstrap_.abort(exit_code);
    std::_Exit(exit_code);  // bootstrap_.abort does not return; this is for the compiler
  }

 private:
  cudaStream_t stream() const { return ctx_->comm.get(); }

  template <typename What>
  void check_alive(const What& what) const {
    if (!failure_.empty()) {
      MIX_FAIL("NCCL " << what() << " on " << process_identity()
                       << ": the NCCL communicator was aborted after an earlier failure: " << failure_);
    }
  }

  template <typename What>
  void prepare(const What& what) {
    check_alive(what);
    MIX_CUDA_CHECK(cudaSetDevice(device_));
    // The buffer may still be being written by kernels queued on the compute
    // stream: the communication stream waits for them on the device.
    compute_done_->record(ctx_->compute.get());
    compute_done_->wait(stream());
  }

  // Device (or managed) memory of this rank's GPU, or a message that says what it is.
  template <typename What>
  void check_device_buffer(const void* p, const char* which, const What& what) const {
    // On a thread that never chose a device, the query would start a context on GPU 0.
    MIX_CUDA_CHECK(cudaSetDevice(device_));
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky; do not leave it for an unrelated check to find
      MIX_FAIL("NCCL " << what() << " on " << process_identity() << ": cannot tell what memory the " << which << " "
                       << p << " is (" << cudaGetErrorString(e) << ")");
    }
    if (attr.type == cudaMemoryTypeManaged) return;
    if (attr.type != cudaMemoryTypeDevice) {
      MIX_FAIL("NCCL " << what() << " on " << process_identity() << ": the " << which << " " << p
                       << " is host memory, but the NCCL communicator takes device buffers of GPU " << device_
                       << " (host data goes through the host communicator)");
    }
    if (attr.device != device_) {
      MIX_FAIL("NCCL " << what() << " on " << process_identity() << ": the " << which << " " << p << " is on GPU "
                       << attr.device << ", but this rank's NCCL communicator drives GPU " << device_);
    }
  }

  void init_nccl() {
    // Rank 0 makes the id and says whether it could: if it could not, every rank
    // fails here together instead of the others waiting in ncclCommInitRank.
    struct {
      int32_t ok;
      ncclUniqueId id;
    } hello{};
    std::string rank0_error;
    if (rank_ == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&hello.id);
      hello.ok = rc == ncclSuccess ? 1 : 0;
      if (rc != ncclSuccess) rank0_error = nccl_error_text(rc);
    }
    bootstrap_.broadcast(&hello, sizeof(hello), 0);
    if (!hello.ok) {
      MIX_FAIL("NCCL init on " << process_identity() << ": rank 0 could not create the NCCL unique id"
                               << (rank0_error.empty() ? std::string(" (see rank 0's log)") : ": " + rank0_error));
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    // Non-blocking: ncclCommInitRank and every launch return at once, so that a
    // peer that never arrives ends in a timeout here, not in a hang inside NCCL.
    config.blocking = 0;
    const auto what = [&] {
      return MIX_STR_CAT("ncclCommInitRank (rank " << rank_ << " of " << world_ << ", GPU " << device_ << ")");
    };
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, world_, hello.id, rank_, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) fail(what(), nccl_error_text(rc, comm_));
    await(what, /*stream_work=*/false, std::max(timeout_s_, kMinInitTimeoutS));
  }

  // One ncclCommGetAsyncError, without waiting: fail() on an error.
  template <typename What>
  void check_async_error(const What& what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) fail(what(), "ncclCommGetAsyncError failed: " + nccl_error_text(rc, comm_));
    if (state != ncclSuccess && state != ncclInProgress) fail(what(), nccl_error_text(state, comm_));
  }

  // An event for a started collective: a spare one when there is (buckets
  // start every step; creating events each time would cost driver calls).
  std::unique_ptr<cuda::Event> take_event() {
    if (spare_events_.empty()) return std::make_unique<cuda::Event>();
    std::unique_ptr<cuda::Event> e = std::move(spare_events_.back());
    spare_events_.pop_back();
    return e;
  }

  // `rc` is what the launching call returned; then waits for the collective.
  template <typename What>
  void launch_and_wait(const What& what, ncclResult_t rc) {
    if (rc != ncclSuccess && rc != ncclInProgress) fail(what(), nccl_error_text(rc, comm_));
    await(what, /*stream_work=*/true, timeout_s_);
  }

  // The watchdog: returns when the communicator's state is ncclSuccess and, with
  // stream_work, the communication stream is idle; aborts and throws on an
  // error or when the timeout passes.
  // `limit_s`: the timeout (ncclCommInitRank's is longer).
  template <typename What>
  void await(const What& what, bool stream_work, double limit_s) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto timeout = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(limit_s));
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
      if (rc != ncclSuccess) fail(what(), "ncclCommGetAsyncError failed: " + nccl_error_text(rc, comm_));
      if (state != ncclSuccess && state != ncclInProgress) fail(what(), nccl_error_text(state, comm_));
      bool done = state == ncclSuccess;
      if (done && stream_work) {
        // The communication stream, and the compute-stream point prepare() ordered
        // it after: CUDA does not say whether a trailing cudaStreamWaitEvent (all
        // that synchronize() queues) counts as pending work of the stream, so
        // both are polled.
        const std::pair<cudaError_t, const char*> states[] = {{cudaStreamQuery(stream()), "communication"},
                                                              {cudaEventQuery(compute_done_->get()), "compute"}};
        for (const auto& [e, which] : states) {
          if (e == cudaErrorNotReady) {
            (void)cudaGetLastError();  // "not ready" is no error; leave nothing for a later check to trip over
            done = false;
          } else if (e != cudaSuccess) {
            fail(what(), std::string("CUDA error on the ") + which + " stream: " + cudaGetErrorString(e) +
                             " (a kernel before or inside the collective failed; CUDA_LAUNCH_BLOCKING=1 and "
                             "compute-sanitizer narrow it down)");
          }
        }
      }
      if (done) return;
      const auto waited = clock::now() - start;
      if (waited >= timeout) {
        fail(what(),
             std::string("no progress within ") + format_seconds(limit_s) + " (--collective-timeout, or MIX_NCCL_TIMEOUT_S; " +
                 (state == ncclInProgress ? "NCCL had not finished setting the call up"
                                          : "the collective was queued on the GPU but did not complete") +
                 "): another rank has probably died, hangs, or called a different collective (a different order, "
                 "count, dtype or root); look at the other ranks' logs first, rerun with NCCL_DEBUG=INFO "
                 "(NCCL_DEBUG_SUBSYS=INIT,COLL,NET) to see where NCCL waits, and raise --collective-timeout only if "
                 "one collective really takes that long");
      }
      backoff.pause(waited);
    }
  }

  // Aborts the NCCL communicator (ending its kernels), remembers why, throws.
  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    std::string msg = "NCCL " + what + " failed on " + process_identity() + ", GPU " + std::to_string(device_) + ": " +
                      why + "; the NCCL communicator was aborted";
    failure_ = msg;
    if (!abort_nccl())
      msg += " (ncclCommAbort did not return within " + format_seconds(timeout_s_) +
             ": GPU work queued before the collective may be stuck; the job has to end)";
    failure_ = msg;
    throw Error(msg);
  }

  // ncclCommAbort, waited for at most the timeout; false if it had not
  // returned by then. It may itself wait for the device (NCCL's stream is
  // ordered after the compute stream, which may hold stuck non-NCCL work, the
  // very case the watchdog is for), and a rank must fail rather than hang, so
  // it runs on a helper thread that owns the communicator from then on: past
  // the deadline the thread is left behind and the process is expected to end
  // (the caller throws, or ends the job; run_worker then skips the exit-time
  // teardown the thread would race: note_thread_left_in_library). Afterwards
  // comm_ is null either way.
  bool abort_nccl() noexcept {
    if (!comm_) return true;
    if (failure_.empty()) failure_ = "abort() was called";
    const ncclComm_t comm = comm_;
    comm_ = nullptr;
    // The started collectives ended with the communicator; a later wait() names
    // the failure. Event destructors never throw (cudaEventDestroy of a recorded
    // event releases it once the stream gets there).
    pending_.clear();
    // Shared: the thread may outlive this frame (and this object).
    auto done = std::make_shared<std::atomic<bool>>(false);
    try {
      std::thread helper([comm, done, device = device_] {
        MIX_CUDA_CHECK_NOTHROW(cudaSetDevice(device));  // a new thread starts on GPU 0
        MIX_NCCL_CHECK_NOTHROW(ncclCommAbort(comm));
        done->store(true);
      });
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
      while (!done->load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (done->load()) {
        helper.join();
        return true;
      }
      helper.detach();
      note_thread_left_in_library();  // the process has to end without teardown
      return false;
    } catch (const std::system_error&) {  // no thread to be had: abort here, unbounded
      MIX_NCCL_CHECK_NOTHROW(ncclCommAbort(comm));
      return true;
    }
  }

  // Frees everything; never throws. graceful: finalize (flushing outstanding
  // work, bounded by the timeout) and destroy; otherwise, or if that fails, abort.
  void release(bool graceful) noexcept {
    if (comm_) {
      MIX_CUDA_CHECK_NOTHROW(cudaSetDevice(device_));
      if (graceful && finalize_nccl()) {
        MIX_NCCL_CHECK_NOTHROW(ncclCommDestroy(comm_));
        comm_ = nullptr;
      } else if (!abort_nccl()) {
        std::fprintf(stderr, "%s: ncclCommAbort did not return within %s; leaving the NCCL communicator behind\n",
                     process_identity().c_str(), format_seconds(timeout_s_).c_str());
      }
    }
    // After a failure the device may still hold stuck work, and cudaFree waits
    // for the whole device: the four bytes stay with the process, which is ending.
    if (barrier_buf_ && failure_.empty()) MIX_CUDA_CHECK_NOTHROW(cudaFree(barrier_buf_));
    barrier_buf_ = nullptr;
    // Requests never waited for (an exception between start and wait): their
    // events go with the communicator; destroying them never throws.
    pending_.clear();
    spare_events_.clear();
    compute_done_.reset();
  }

  // ncclCommFinalize, polled until the communicator is quiescent; false (with a
  // report on stderr) on an error or after the timeout.
  bool finalize_nccl() noexcept {
    ncclResult_t rc = ncclCommFinalize(comm_);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      report_nccl_failure("ncclCommFinalize(comm_)", __FILE__, __LINE__, rc);
      return false;
    }
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto timeout = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_s_));
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      rc = ncclCommGetAsyncError(comm_, &state);
      if (rc != ncclSuccess) {
        report_nccl_failure("ncclCommGetAsyncError(comm_, &state)", __FILE__, __LINE__, rc);
        return false;
      }
      if (state == ncclSuccess) return true;
      if (state != ncclInProgress) {
        report_nccl_failure("ncclCommFinalize(comm_) (asynchronous result)", __FILE__, __LINE__, state);
        return false;
      }
      const auto waited = clock::now() - start;
      if (waited >= timeout) {
        std::fprintf(stderr,
                     "mixtrain: ncclCommFinalize did not finish within %g s (--collective-timeout) on GPU %d; "
                     "aborting the NCCL communicator instead [%s]\n",
                     timeout_s_, device_, process_identity().c_str());
        return false;
      }
      backoff.pause(waited);
    }
  }

  Communicator& bootstrap_;
  const int device_;
  const int rank_, world_, local_rank_, local_size_;
  const double timeout_s_;
  cuda::DeviceContext* ctx_ = nullptr;
  std::unique_ptr<cuda::Event> compute_done_;
  // Started all-reduces not yet waited for: the event recorded on the
  // communication stream after each (null for an empty one).
  std::unordered_map<Request, std::unique_ptr<cuda::Event>> pending_;
  std::vector<std::unique_ptr<cuda::Event>> spare_events_;
  void* barrier_buf_ = nullptr;  // one int32 on the device, for barrier()
  ncclComm_t comm_ = nullptr;
  std::string failure_;  // the first failure; set once the communicator is aborted
};

// The CUDA backend provides the device communicator: callers reach it through
// make_device_communicator() without an #ifdef.
struct RegisterNccl {
  RegisterNccl() {
    register_device_communicator_factory(&make_nccl_communicator);
    register_library_version("NCCL", std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                                         std::to_string(NCCL_PATCH));
  }
};
[[maybe_unused]] const RegisterNccl g_register_nccl;

}  // namespace

double nccl_timeout_seconds() {
  const char* v = std::getenv("MIX_NCCL_TIMEOUT_S");
  if (!v || !*v) return kDefaultTimeoutS;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(s) || s <= 0) {
    MIX_FAIL("MIX_NCCL_TIMEOUT_S=" << v << " is not a positive number of seconds (the default is "
                                   << kDefaultTimeoutS << ")");
  }
  // Deadlines are steady_clock points (int64 nanoseconds): past ~292 years they
  // would overflow. A billion seconds is "never" in practice.
  return std::min(s, kMaxTimeoutS);
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device) {
  return std::make_unique<NcclCommunicator>(bootstrap, device);
}

}  // namespace mix::collective
