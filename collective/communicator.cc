#include "collective/communicator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "runtime/core/check.h"
#include "runtime/core/half.h"

namespace mix::collective {

namespace {
std::atomic<bool> g_thread_left_in_library{false};
}  // namespace

void note_thread_left_in_library() noexcept { g_thread_left_in_library.store(true); }
bool thread_left_in_library() noexcept { return g_thread_left_in_library.load(); }

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
  }
  return "?";
}

void Communicator::count(size_t payload_bytes, Traffic traffic) {
  if (traffic == Traffic::gradients) {
    bytes_.grad_allreduce_bytes += payload_bytes;
    bytes_.grad_allreduce_calls += 1;
  } else {
    bytes_.other_bytes += payload_bytes;
  }
}

Request Communicator::all_reduce_start(void* buf, size_t count, DType dtype, ReduceOp op, Traffic traffic) {
  all_reduce(buf, count, dtype, op, traffic);
  const Request r = next_request();
  started_.insert(r);
  return r;
}

void Communicator::broadcast_many(const std::vector<ByteSpan>& buffers, int root) {
  for (const ByteSpan& b : buffers) broadcast(b.data, b.bytes, root);
}

void Communicator::wait(Request request) {
  MIX_CHECK(started_.erase(request) == 1, "wait for all-reduce request " << request << " on the " << backend_name()
                                                                        << " communicator, which has no such request "
                                                                           "in flight (never started, or already waited for)");
}

namespace {

// Max that propagates NaN whatever the operand order, so that every reduction
// tree an MPI library may pick gives the same answer (std::max does not: it
// returns its first argument when the comparison is false). Of -0 and +0 it
// picks +0, for the same reason.
template <typename F>
F nan_max(F a, F b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a == b) return std::signbit(a) ? b : a;
  return a < b ? b : a;
}

// Integer sums wrap (two's complement) instead of being undefined, matching
// what MPI_SUM does on every implementation we know of.
template <typename I>
void int_reduce(I* inout, const I* in, size_t n, ReduceOp op) {
  using U = std::make_unsigned_t<I>;
  if (op == ReduceOp::max) {
    for (size_t i = 0; i < n; ++i) inout[i] = inout[i] < in[i] ? in[i] : inout[i];
  } else {
    for (size_t i = 0; i < n; ++i) inout[i] = static_cast<I>(static_cast<U>(inout[i]) + static_cast<U>(in[i]));
  }
}

void f32_reduce(float* inout, const float* in, size_t n, ReduceOp op) {
  if (op == ReduceOp::max) {
    for (size_t i = 0; i < n; ++i) inout[i] = nan_max(inout[i], in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) inout[i] += in[i];
  }
}

// f16/bf16: widen a block to FP32 (the bulk converters use F16C when the CPU
// has it), combine, round back once. One call is one hop of a ring or tree.
void half_reduce(uint16_t* inout, const uint16_t* in, size_t n, DType dtype, ReduceOp op) {
  if (dtype == DType::f16 && op != ReduceOp::max) {
    // The gradient all-reduce's case: fused widen-add-round, the same bits as
    // the blocked loop below, without its staging copies.
    half_bulk::f16_add(inout, in, n);
    return;
  }
  constexpr size_t kBlock = 256;
  float a[kBlock];
  float b[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    if (dtype == DType::f16) {
      half_bulk::f16_to_f32(inout + base, a, m);
      half_bulk::f16_to_f32(in + base, b, m);
    } else {
      half_bulk::bf16_to_f32(inout + base, a, m);
      half_bulk::bf16_to_f32(in + base, b, m);
    }
    if (op == ReduceOp::max) {
      // The larger input is stored unchanged: no rounding, and NaN bits pass through.
      // Same choice as nan_max: a NaN wins, then the larger value, then +0 over -0.
      for (size_t i = 0; i < m; ++i) {
        const bool take_in = !std::isnan(a[i]) && (std::isnan(b[i]) || a[i] < b[i] ||
                                                   (a[i] == b[i] && std::signbit(a[i]) && !std::signbit(b[i])));
        if (take_in) inout[base + i] = in[base + i];
      }
      continue;
    }
    for (size_t i = 0; i < m; ++i) a[i] += b[i];
    if (dtype == DType::f16) {
      half_bulk::f32_to_f16(a, inout + base, m);
    } else {
      half_bulk::f32_to_bf16(a, inout + base, m);
    }
  }
}

}  // namespace

void reduce_into(void* inout, const void* in, size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  MIX_CHECK(inout != nullptr && in != nullptr, "reduce_into of " << count << " elements got a null buffer");
  // avg combines like sum: the 1/world multiply happens once, after the whole reduction.
  switch (dtype) {
    case DType::f32:
      f32_reduce(static_cast<float*>(inout), static_cast<const float*>(in), count, op);
      return;
    case DType::f16:
    case DType::bf16:
      half_reduce(static_cast<uint16_t*>(inout), static_cast<const uint16_t*>(in), count, dtype, op);
      return;
    case DType::i32:
      int_reduce(static_cast<int32_t*>(inout), static_cast<const int32_t*>(in), count, op);
      return;
    case DType::i64:
      int_reduce(static_cast<int64_t*>(inout), static_cast<const int64_t*>(in), count, op);
      return;
    case DType::u8:
      int_reduce(static_cast<uint8_t*>(inout), static_cast<const uint8_t*>(in), count, op);
      return;
  }
  MIX_FAIL("reduce_into: unknown dtype " << static_cast<int>(dtype));
}

namespace {
const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

#ifndef MIX_HAVE_MPI
// The world size the launcher announced, or 0 when it did not say.
long launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* v = env_or_null(name)) return std::strtol(v, nullptr, 10);
  }
  return 0;
}
#endif
}  // namespace

bool launched_under_mpi() {
  // Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMIx launchers (Open MPI 4+,
  // Slurm with --mpi=pmix) set PMIX_RANK; MPICH's Hydra and Slurm's PMI-1/2 set PMI_RANK/PMI_SIZE.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (env_or_null(name)) return true;
  }
  return false;
}

#ifndef MIX_HAVE_MPI
std::unique_ptr<Communicator> make_mpi_communicator() {
  MIX_FAIL("this build of mixtrain has no MPI (configured with MIX_WITH_MPI=OFF or without an MPI library); "
           "install Open MPI (scripts/setup.sh, apt-get install openmpi-bin libopenmpi-dev) and rebuild, "
           "or run a single process without mpirun");
}
#endif

std::unique_ptr<Communicator> make_default_communicator() {
#ifdef MIX_HAVE_MPI
  if (launched_under_mpi()) return make_mpi_communicator();
#else
  // N copies of a world-size-1 run would each think they are rank 0 and write
  // the same files: refuse rather than train N times over.
  if (launched_under_mpi() && launcher_world_size() > 1) {
    MIX_FAIL("this process was started by mpirun with " << launcher_world_size()
             << " ranks, but this build of mixtrain has no MPI; rebuild with MPI (MIX_WITH_MPI=ON, "
                "scripts/setup.sh installs Open MPI) or run one process without mpirun");
  }
#endif
  return make_local_communicator();
}

namespace {
DeviceCommunicatorFactory& device_comm_factory() {
  static DeviceCommunicatorFactory f = nullptr;
  return f;
}
DeviceBinder& device_binder() {
  static DeviceBinder f = nullptr;
  return f;
}
}  // namespace

void register_device_communicator_factory(DeviceCommunicatorFactory f) { device_comm_factory() = f; }
void register_device_binder(DeviceBinder f) { device_binder() = f; }

std::unique_ptr<Communicator> make_device_communicator(Communicator& bootstrap, int device) {
  if (!device_comm_factory())
    MIX_FAIL("this build has no device communicator (NCCL comes with -DMIX_WITH_CUDA=ON); use --device cpu");
  return device_comm_factory()(bootstrap, device);
}

int bind_device(Communicator& bootstrap) {
  if (!device_binder()) MIX_FAIL("this build has no CUDA backend (-DMIX_WITH_CUDA=ON); use --device cpu");
  return device_binder()(bootstrap);
}

}  // namespace mix::collective
