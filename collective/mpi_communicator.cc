// MPI backend over host buffers (a duplicate of MPI_COMM_WORLD).
//
// f16 and bf16 reductions go through user-defined ops that call reduce_into, so
// that each hop adds in FP32 and rounds to 16 bits, as a GPU ring does; MPI has
// no half types of its own. f32 max is a user-defined op too: the builtin
// MPI_MAX keeps or drops a NaN depending on operand order, so two ranks of a
// recursive-doubling all-reduce could end up disagreeing.
//
// Every collective is started non-blocking and waited for by await(), which
// keeps a deadline (--collective-timeout): a rank that has waited that long
// asks every peer, on a communicator of its own, where it is. Peers answer
// from their own waits; a peer that is stopped, stuck in computation or gone
// does not. The rank logs which collective it waits in, at which step, and
// each peer's answer or silence, then aborts the job: no rank hangs forever.
#include "collective/mpi_communicator.h"

#include "collective/mpi_check.h"  // first: it includes <mpi.h> without the C++ bindings

#include <spdlog/spdlog.h>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <utility>
#include <vector>

#include "collective/communicator.h"
#include "runtime/core/check.h"
#include "runtime/core/half.h"
#include "runtime/core/library_versions.h"

namespace mix::collective {

namespace {

// Communicators alive in this process, and whether one of them called MPI_Init:
// MPI is finalized with the last one, and only when we started it.
int g_live = 0;
bool g_we_initialized = false;

// MPI calls user functions from C: an exception must not cross it. reduce_into
// throws only on null buffers, which MPI never passes, but be safe.
template <DType D, ReduceOp O>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  try {
    reduce_into(inout, in, static_cast<size_t>(*len), D, O);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mixtrain: reduction inside MPI failed: %s\n", e.what());
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

// Frees a derived datatype at scope exit, throwing or not.
struct TypeGuard {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  ~TypeGuard() {
    if (type != MPI_DATATYPE_NULL) MIX_MPI_CHECK_NOTHROW(MPI_Type_free(&type));
  }
};

// avg = sum * (1/world), once, after the whole reduction; 16-bit types scale in
// FP32 and round back. Integers divide (truncating toward zero).
void scale_by_inverse_world(void* buf, size_t n, DType dtype, int world) {
  const float inv = 1.0f / static_cast<float>(world);
  switch (dtype) {
    case DType::f32: {
      auto* p = static_cast<float*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] *= inv;
      return;
    }
    case DType::f16:
    case DType::bf16: {
      auto* p = static_cast<uint16_t*>(buf);
      constexpr size_t kBlock = 256;
      float tmp[kBlock];
      for (size_t base = 0; base < n; base += kBlock) {
        const size_t m = std::min(kBlock, n - base);
        if (dtype == DType::f16) {
          half_bulk::f16_to_f32(p + base, tmp, m);
        } else {
          half_bulk::bf16_to_f32(p + base, tmp, m);
        }
        for (size_t i = 0; i < m; ++i) tmp[i] *= inv;
        if (dtype == DType::f16) {
          half_bulk::f32_to_f16(tmp, p + base, m);
        } else {
          half_bulk::f32_to_bf16(tmp, p + base, m);
        }
      }
      return;
    }
    case DType::i32: {
      auto* p = static_cast<int32_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] /= world;
      return;
    }
    case DType::i64: {
      auto* p = static_cast<int64_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] /= world;
      return;
    }
    case DType::u8: {
      auto* p = static_cast<uint8_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(p[i] / world);
      return;
    }
  }
}

// Open MPI's non-blocking all-reduce (coll/libnbc) picks a binomial tree
// (reduce to one rank, then broadcast) for every in-place call and for fewer
// than 4 ranks; our gradient buckets are both. The tree moves each byte
// log2(p) times through one rank and reduces the whole bucket there; the ring
// splits the reduction across ranks and is what NCCL uses; over shared memory
// it syncs ResNet-50's gradients faster in both dtypes (mixbench grad-sync
// --model resnet50; docs/bandwidth.md). Read at MPI_Init, so it is set just
// before; a value the user gave (mpirun --mca, or the environment) wins.
// Other MPI libraries ignore OMPI_MCA_ variables.
void prefer_ring_for_started_allreduces() {
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The probe's messages, on a communicator used for nothing else.
constexpr int kAskTag = 1;     // "where are you?": the asker's rank
constexpr int kAnswerTag = 2;  // the answer: text, kAnswerBytes at most
constexpr int kAnswerBytes = 192;

// What a rank is doing in a collective, for the reports of the timeout.
struct Activity {
  const char* op = "";  // "all_reduce", "barrier", ...
  size_t bytes = 0;
  int64_t step = 0;

  std::string where() const {
    return std::string(op) + (bytes ? " of " + std::to_string(bytes) + " bytes" : std::string()) +
           (step > 0 ? " at step " + std::to_string(step) : std::string(" before training"));
  }
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(size_t max_bytes_per_call) : max_bytes_per_call_(std::max<size_t>(1, max_bytes_per_call)) {
    int initialized = 0;
    MIX_MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) {
      int finalized = 0;
      MIX_MPI_CHECK(MPI_Finalized(&finalized));
      MIX_CHECK(!finalized, "MPI was already finalized in this process; it cannot be started again "
                            "(keep one MPI communicator alive for the whole run)");
      prefer_ring_for_started_allreduces();
      int provided = 0;
      // FUNNELED: only the main thread calls MPI; other threads may exist (BLAS, data loading).
      MIX_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
      g_we_initialized = true;
      if (provided < MPI_THREAD_FUNNELED) {
        spdlog::warn("MPI provides thread level {} below MPI_THREAD_FUNNELED; keep every MPI call on the main thread",
                     provided);
      }
    }
    ++g_live;
    try {
      // Errors come back as return codes, for MIX_MPI_CHECK to report, instead
      // of MPI aborting the job with no context.
      MIX_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
      // A private duplicate (it inherits the error handler): our traffic never
      // matches a message of a library sharing MPI_COMM_WORLD.
      MIX_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
      MIX_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &probe_comm_));
      MIX_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
      MIX_MPI_CHECK(MPI_Comm_size(comm_, &world_));
      set_process_identity(rank_, world_);

      // Key = world rank keeps the ranks of one host in world order.
      MPI_Comm host = MPI_COMM_NULL;
      MIX_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host));
      MIX_MPI_CHECK(MPI_Comm_rank(host, &local_rank_));
      MIX_MPI_CHECK(MPI_Comm_size(host, &local_size_));
      MIX_MPI_CHECK(MPI_Comm_free(&host));

      // One 2-byte element type for f16 and bf16; the op says how to add them.
      MIX_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &half_type_));
      MIX_MPI_CHECK(MPI_Type_commit(&half_type_));
      MIX_MPI_CHECK(MPI_Op_create(&user_reduce<DType::f16, ReduceOp::sum>, 1, &f16_sum_));
      MIX_MPI_CHECK(MPI_Op_create(&user_reduce<DType::f16, ReduceOp::max>, 1, &f16_max_));
      MIX_MPI_CHECK(MPI_Op_create(&user_reduce<DType::bf16, ReduceOp::sum>, 1, &bf16_sum_));
      MIX_MPI_CHECK(MPI_Op_create(&user_reduce<DType::bf16, ReduceOp::max>, 1, &bf16_max_));
      MIX_MPI_CHECK(MPI_Op_create(&user_reduce<DType::f32, ReduceOp::max>, 1, &f32_max_));
    } catch (...) {
      release();
      throw;
    }
  }

  ~MpiCommunicator() override { release(); }

  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend_name() const override { return "mpi"; }

  void all_reduce(void* buf, size_t n, DType dtype, ReduceOp op, Traffic traffic) override {
    all_reduce_into(buf, buf, n, dtype, op, traffic);
  }

  void all_reduce_into(const void* send, void* buf, size_t n, DType dtype, ReduceOp op, Traffic traffic) override {
    MIX_CHECK((buf != nullptr && send != nullptr) || n == 0, "all_reduce of " << n << " " << dtype_name(dtype)
                                                                               << " elements (" << reduce_op_name(op)
                                                                               << ") got a null buffer");
    count(n * dtype_size(dtype), traffic);
    if (n == 0) return;

    const auto [type, mpi_op] = mpi_type_and_op(dtype, op);
    const size_t elem = dtype_size(dtype);
    const size_t chunk = elements_per_call(elem);
    auto* p = static_cast<char*>(buf);
    const auto* src = static_cast<const char*>(send);
    for (size_t off = 0; off < n; off += chunk) {
      const int c = static_cast<int>(std::min(chunk, n - off));
      const void* from = send == buf ? MPI_IN_PLACE : static_cast<const void*>(src + off * elem);
      MPI_Request request = MPI_REQUEST_NULL;
      MIX_MPI_CHECK(MPI_Iallreduce(from, p + off * elem, c, type, mpi_op, comm_, &request));
      await(&request, 1, "all_reduce", n * elem);
    }
    if (op == ReduceOp::avg) scale_by_inverse_world(buf, n, dtype, world_);
  }

  Request all_reduce_start(void* buf, size_t n, DType dtype, ReduceOp op, Traffic traffic) override {
    MIX_CHECK(buf != nullptr || n == 0, "all_reduce_start of " << n << " " << dtype_name(dtype) << " elements ("
                                                                << reduce_op_name(op) << ") got a null buffer");
    count(n * dtype_size(dtype), traffic);
    const Request id = next_request();
    Pending& p = pending_[id];
    p.buf = buf;
    p.count = n;
    p.dtype = dtype;
    p.op = op;
    if (n == 0) return id;
    const auto [type, mpi_op] = mpi_type_and_op(dtype, op);
    const size_t elem = dtype_size(dtype);
    const size_t chunk = elements_per_call(elem);
    auto* base = static_cast<char*>(buf);
    for (size_t off = 0; off < n; off += chunk) {
      const int c = static_cast<int>(std::min(chunk, n - off));
      p.requests.push_back(MPI_REQUEST_NULL);
      MIX_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, base + off * elem, c, type, mpi_op, comm_, &p.requests.back()));
    }
    return id;
  }

  void forget(Request id) override {
    MIX_FAIL("MPI communicator: all-reduce request " << id << " cannot be given up (MPI_Iallreduce may still write "
                                                     << "its buffer); only device steps are recorded");
  }

  void wait(Request id) override {
    auto it = pending_.find(id);
    MIX_CHECK(it != pending_.end(), "wait for all-reduce request " << id << " on the MPI communicator, which has no "
                                                                      "such request in flight (never started, or "
                                                                      "already waited for)");
    Pending p = std::move(it->second);
    pending_.erase(it);
    if (!p.requests.empty())
      await(p.requests.data(), static_cast<int>(p.requests.size()), "started all_reduce", p.count * dtype_size(p.dtype));
    if (p.op == ReduceOp::avg) scale_by_inverse_world(p.buf, p.count, p.dtype, world_);
  }

  void progress() override {
    // One test of any in-flight request runs Open MPI's progress engine, which
    // advances every non-blocking collective, not only that one.
    for (auto& [id, p] : pending_) {
      for (MPI_Request& r : p.requests) {
        if (r == MPI_REQUEST_NULL) continue;
        int done = 0;
        MIX_MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
        return;
      }
    }
  }

  size_t in_flight() const override { return pending_.size(); }

  void broadcast(void* buf, size_t bytes, int root) override {
    MIX_CHECK(root >= 0 && root < world_, "broadcast root " << root << " is not a rank of a world of size " << world_);
    MIX_CHECK(buf != nullptr || bytes == 0, "broadcast of " << bytes << " bytes got a null buffer");
    count(bytes, Traffic::control);
    const size_t chunk = elements_per_call(1);
    auto* p = static_cast<char*>(buf);
    for (size_t off = 0; off < bytes; off += chunk) {
      const int c = static_cast<int>(std::min(chunk, bytes - off));
      MPI_Request request = MPI_REQUEST_NULL;
      MIX_MPI_CHECK(MPI_Ibcast(p + off, c, MPI_BYTE, root, comm_, &request));
      await(&request, 1, "broadcast", bytes);
    }
  }

  void broadcast_many(const std::vector<ByteSpan>& buffers, int root) override {
    MIX_CHECK(root >= 0 && root < world_, "broadcast root " << root << " is not a rank of a world of size " << world_);
    size_t total = 0;
    for (const ByteSpan& b : buffers) {
      MIX_CHECK(b.data != nullptr || b.bytes == 0, "broadcast_many: a buffer of " << b.bytes << " bytes is null");
      total += b.bytes;
    }
    // One message instead of one per buffer: each MPI_Bcast costs a round of
    // latency, the copies in and out cost next to nothing at these sizes.
    packed_.resize(total);
    size_t off = 0;
    if (rank_ == root) {
      for (const ByteSpan& b : buffers) {
        if (b.bytes) std::memcpy(packed_.data() + off, b.data, b.bytes);
        off += b.bytes;
      }
    }
    broadcast(packed_.data(), total, root);
    if (rank_ == root) return;
    off = 0;
    for (const ByteSpan& b : buffers) {
      if (b.bytes) std::memcpy(b.data, packed_.data() + off, b.bytes);
      off += b.bytes;
    }
  }

  void all_gather(const void* send, void* recv, size_t bytes_per_rank) override {
    MIX_CHECK((send != nullptr && recv != nullptr) || bytes_per_rank == 0,
              "all_gather of " << bytes_per_rank << " bytes per rank got a null buffer");
    count(bytes_per_rank, Traffic::control);
    if (bytes_per_rank == 0) return;
    auto* out = static_cast<char*>(recv);
    // A send buffer that already sits in this rank's slot must be passed as
    // MPI_IN_PLACE: MPI forbids overlapping send and receive buffers.
    const bool in_place = send == out + static_cast<size_t>(rank_) * bytes_per_rank;
    const auto* in = static_cast<const char*>(send);
    const size_t chunk = elements_per_call(1);
    if (bytes_per_rank <= chunk) {
      const int c = static_cast<int>(bytes_per_rank);
      MPI_Request request = MPI_REQUEST_NULL;
      MIX_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, c, MPI_BYTE, recv, c, MPI_BYTE, comm_, &request));
      await(&request, 1, "all_gather", bytes_per_rank);
      return;
    }
    // Chunk k of every rank's block: a receive type of `c` bytes whose extent is
    // a whole block puts rank j's piece at recv + j * bytes_per_rank + offset.
    for (size_t off = 0; off < bytes_per_rank; off += chunk) {
      const int c = static_cast<int>(std::min(chunk, bytes_per_rank - off));
      TypeGuard piece;
      TypeGuard strided;
      MIX_MPI_CHECK(MPI_Type_contiguous(c, MPI_BYTE, &piece.type));
      MIX_MPI_CHECK(MPI_Type_create_resized(piece.type, 0, static_cast<MPI_Aint>(bytes_per_rank), &strided.type));
      MIX_MPI_CHECK(MPI_Type_commit(&strided.type));
      MPI_Request request = MPI_REQUEST_NULL;
      MIX_MPI_CHECK(
          MPI_Iallgather(in_place ? MPI_IN_PLACE : in + off, c, MPI_BYTE, out + off, 1, strided.type, comm_, &request));
      await(&request, 1, "all_gather", bytes_per_rank);
    }
  }

  void barrier() override {
    MPI_Request request = MPI_REQUEST_NULL;
    MIX_MPI_CHECK(MPI_Ibarrier(comm_, &request));
    await(&request, 1, "barrier", 0);
  }

  void set_timeout(double seconds) override { timeout_s_ = seconds; }

  [[noreturn]] void abort(int exit_code) override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this is for the compiler and broken MPIs.
  }

 private:
  // Waits for `n` requests of collective `op` (`bytes` of payload) under the
  // deadline. Polls as MPI_Wait would (Open MPI's blocking calls poll too, and
  // yield the core when oversubscribed); every few hundred polls it answers
  // peers that ask where this rank is and checks the clock.
  void await(MPI_Request* requests, int n, const char* op, size_t bytes) {
    int done = 0;
    MIX_MPI_CHECK(MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    const Activity activity{op, bytes, step()};
    const Clock::time_point start = Clock::now();
    for (uint32_t polls = 1;; ++polls) {
      MIX_MPI_CHECK(MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE));
      if (done) return;
      if (polls % 256 != 0) continue;
      const double waited = seconds_since(start);
      answer_peers(activity, waited);
      if (waited > timeout_s_) report_and_abort(activity, waited);
    }
  }

  // Answers each peer's "where are you?" waiting on the probe communicator.
  void answer_peers(const Activity& activity, double waited) {
    for (;;) {
      int asked = 0;
      MPI_Status status;
      MIX_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kAskTag, probe_comm_, &asked, &status));
      if (!asked) return;
      int asker = -1;
      MIX_MPI_CHECK(MPI_Recv(&asker, 1, MPI_INT, status.MPI_SOURCE, kAskTag, probe_comm_, MPI_STATUS_IGNORE));
      char answer[kAnswerBytes] = {0};
      std::snprintf(answer, sizeof answer, "waiting in %s for %.0f s", activity.where().c_str(), waited);
      // Small enough to go eagerly: the send returns without the asker's receive.
      MIX_MPI_CHECK(MPI_Send(answer, kAnswerBytes, MPI_CHAR, status.MPI_SOURCE, kAnswerTag, probe_comm_));
    }
  }

  // The deadline passed: asks every peer where it is, waits a little for
  // answers (answering theirs meanwhile: they may be timing out too), logs
  // what it found and aborts the job.
  [[noreturn]] void report_and_abort(const Activity& activity, double waited) {
    std::vector<MPI_Request> asks;
    for (int peer = 0; peer < world_; ++peer) {
      if (peer == rank_) continue;
      asks.push_back(MPI_REQUEST_NULL);
      MIX_MPI_CHECK_NOTHROW(MPI_Isend(&rank_, 1, MPI_INT, peer, kAskTag, probe_comm_, &asks.back()));
    }
    // Long enough for a peer's next poll (it polls while it waits); a peer
    // busy in a long kernel or stopped stays silent.
    const double grace = std::clamp(timeout_s_ / 10, 1.0, 10.0);
    std::map<int, std::string> answers;
    const Clock::time_point asked_at = Clock::now();
    while (static_cast<int>(answers.size()) < world_ - 1 && seconds_since(asked_at) < grace) {
      answer_peers(activity, waited + seconds_since(asked_at));
      int answered = 0;
      MPI_Status status;
      MIX_MPI_CHECK_NOTHROW(MPI_Iprobe(MPI_ANY_SOURCE, kAnswerTag, probe_comm_, &answered, &status));
      if (!answered) {
        sched_yield();
        continue;
      }
      char text[kAnswerBytes] = {0};
      MIX_MPI_CHECK_NOTHROW(
          MPI_Recv(text, kAnswerBytes, MPI_CHAR, status.MPI_SOURCE, kAnswerTag, probe_comm_, MPI_STATUS_IGNORE));
      text[kAnswerBytes - 1] = '\0';
      answers[status.MPI_SOURCE] = text;
    }
    std::string silent, report;
    for (int peer = 0; peer < world_; ++peer) {
      if (peer == rank_) continue;
      const auto it = answers.find(peer);
      if (it == answers.end()) silent += (silent.empty() ? "" : ", ") + std::to_string(peer);
      report += "\n  rank " + std::to_string(peer) + ": " +
                (it != answers.end() ? it->second
                                     : "no answer within " + std::to_string(static_cast<int>(grace)) +
                                           " s (stopped, stuck in computation or I/O, or its host is gone)");
    }
    char head[512];
    std::snprintf(head, sizeof head,
                  "%s has waited %.0f s for the other ranks (--collective-timeout %g); %s. Where each rank is:",
                  activity.where().c_str(), waited, timeout_s_,
                  silent.empty() ? "every rank answered, so they wait in different collectives (a bug: tell the "
                                   "developers)"
                                 : ("it waits for rank(s) " + silent + ", which did not answer").c_str());
    spdlog::error("{}{}\nEnding the job (exit {}).", head, report, kCollectiveTimeoutExitCode);
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, kCollectiveTimeoutExitCode);
    std::_Exit(kCollectiveTimeoutExitCode);
  }

  std::pair<MPI_Datatype, MPI_Op> mpi_type_and_op(DType dtype, ReduceOp op) const {
    const bool is_max = op == ReduceOp::max;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_Op mpi_op = MPI_OP_NULL;
    switch (dtype) {
      case DType::f32:
        type = MPI_FLOAT;
        mpi_op = is_max ? f32_max_ : MPI_SUM;
        break;
      case DType::f16:
        type = half_type_;
        mpi_op = is_max ? f16_max_ : f16_sum_;
        break;
      case DType::bf16:
        type = half_type_;
        mpi_op = is_max ? bf16_max_ : bf16_sum_;
        break;
      case DType::i32:
        type = MPI_INT32_T;
        mpi_op = is_max ? MPI_MAX : MPI_SUM;
        break;
      case DType::i64:
        type = MPI_INT64_T;
        mpi_op = is_max ? MPI_MAX : MPI_SUM;
        break;
      case DType::u8:
        type = MPI_UINT8_T;
        mpi_op = is_max ? MPI_MAX : MPI_SUM;
        break;
    }
    MIX_CHECK(type != MPI_DATATYPE_NULL, "all_reduce: unsupported dtype " << static_cast<int>(dtype));
    return {type, mpi_op};
  }

  // A started all-reduce: its MPI requests (one per chunk) and what wait() finishes.
  struct Pending {
    void* buf = nullptr;
    size_t count = 0;
    DType dtype = DType::f32;
    ReduceOp op = ReduceOp::sum;
    std::vector<MPI_Request> requests;
  };
  std::map<Request, Pending> pending_;  // ordered: progress() tests the oldest first

  // Elements of `elem` bytes one MPI call may carry: within max_bytes_per_call_ and an int count.
  size_t elements_per_call(size_t elem) const {
    return std::clamp<size_t>(max_bytes_per_call_ / elem, 1, static_cast<size_t>(INT_MAX));
  }

  void release() noexcept {
    for (MPI_Op* op : {&f16_sum_, &f16_max_, &bf16_sum_, &bf16_max_, &f32_max_}) {
      if (*op != MPI_OP_NULL) MIX_MPI_CHECK_NOTHROW(MPI_Op_free(op));
    }
    if (half_type_ != MPI_DATATYPE_NULL) MIX_MPI_CHECK_NOTHROW(MPI_Type_free(&half_type_));
    if (comm_ != MPI_COMM_NULL) MIX_MPI_CHECK_NOTHROW(MPI_Comm_free(&comm_));
    if (probe_comm_ != MPI_COMM_NULL) MIX_MPI_CHECK_NOTHROW(MPI_Comm_free(&probe_comm_));
    if (--g_live == 0 && g_we_initialized) {
      g_we_initialized = false;
      MIX_MPI_CHECK_NOTHROW(MPI_Finalize());
    }
  }

  size_t max_bytes_per_call_;
  std::vector<unsigned char> packed_;  // broadcast_many's message, kept for the next step
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm probe_comm_ = MPI_COMM_NULL;  // the timeout's "where are you?" messages
  double timeout_s_ = kDefaultCollectiveTimeoutS;
  int rank_ = 0;
  int world_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  MPI_Datatype half_type_ = MPI_DATATYPE_NULL;
  MPI_Op f16_sum_ = MPI_OP_NULL;
  MPI_Op f16_max_ = MPI_OP_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  MPI_Op bf16_max_ = MPI_OP_NULL;
  MPI_Op f32_max_ = MPI_OP_NULL;
};

}  // namespace

namespace {
// Open MPI says its own release; another MPI, the standard it implements.
#ifdef OMPI_MAJOR_VERSION
[[maybe_unused]] const bool registered = register_library_version(
    "Open MPI", std::to_string(OMPI_MAJOR_VERSION) + "." + std::to_string(OMPI_MINOR_VERSION) + "." +
                    std::to_string(OMPI_RELEASE_VERSION));
#else
[[maybe_unused]] const bool registered =
    register_library_version("MPI", std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION));
#endif
}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(size_t max_bytes_per_call) {
  return std::make_unique<MpiCommunicator>(max_bytes_per_call);
}

std::unique_ptr<Communicator> make_mpi_communicator() { return make_mpi_communicator(kMpiMaxBytesPerCall); }

}  // namespace mix::collective
