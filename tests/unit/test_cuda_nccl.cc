// [cuda] The NCCL communicator at world size 1, bootstrapped from the local
// communicator: every collective is the identity on device buffers, byte
// counters move as with the other backends, and misuse (a host pointer, a bad
// root) is refused with a message without breaking the communicator, and
// synchronize() awaits queued work under the watchdog.
// Without a GPU (or in a build without CUDA) the test exits 77, which CTest
// reports as skipped, never as passed.
#include <catch2/catch.hpp>

#include "tests/unit/require_gpu.h"
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective/communicator.h"
#include "runtime/core/check.h"
#include "runtime/core/dtype.h"
#include "runtime/core/half.h"
#include "runtime/core/random.h"

#ifdef MIX_HAVE_CUDA
#include <cuda_runtime.h>

#include "collective/nccl_communicator.h"
#include "runtime/cuda/context.h"

namespace {

using mix::DType;
using mix::collective::ReduceOp;
using mix::collective::Traffic;
namespace mc = mix::collective;

// Device memory for one test, freed at scope exit.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : bytes(n) { REQUIRE(cudaMalloc(&ptr, n) == cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // A pageable cudaMemcpy to the device may return before its DMA lands, on the
  // legacy stream, which NCCL's non-blocking stream does not wait for: synchronize.
  void upload(const void* src) {
    REQUIRE(cudaMemcpy(ptr, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(bytes);
    REQUIRE(cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }
  void* ptr = nullptr;
  size_t bytes;
};

// n values of `dtype` as raw bytes: random normal values of mixed magnitude,
// plus +-0 and +-inf. No NaN (a NaN's payload need not survive an avg's
// multiply by 1) and no subnormals (whether NCCL's kernels flush them is not
// this test's business): with those, the world-size-1 identity is bit-exact.
std::vector<unsigned char> make_values(DType dtype, size_t n, uint64_t seed) {
  mix::Rng rng(seed);
  std::vector<unsigned char> out(n * mix::dtype_size(dtype));
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) {
    float v = static_cast<float>(rng.normal() * 100.0);
    if (i == 0) v = 0.f;
    if (i == 1) v = -0.f;
    if (i == 2) v = inf;
    if (i == 3) v = -inf;
    unsigned char* p = out.data() + i * mix::dtype_size(dtype);
    switch (dtype) {
      case DType::f32: std::memcpy(p, &v, 4); break;
      case DType::f16: {
        const uint16_t b = mix::float_to_half_bits(v);
        std::memcpy(p, &b, 2);
        break;
      }
      case DType::bf16: {
        const uint16_t b = mix::float_to_bf16_bits(v);
        std::memcpy(p, &b, 2);
        break;
      }
      case DType::i32: {
        const int32_t x = static_cast<int32_t>(rng.next_u64() & 0xffffffffu);  // the full range, negatives too
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::i64: {
        const int64_t x = static_cast<int64_t>(rng.next_u64());
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::u8: {
        const uint8_t x = static_cast<uint8_t>(rng.next_u64());
        std::memcpy(p, &x, 1);
        break;
      }
    }
  }
  return out;
}

void skip_without_gpu() { mix::testing::require_gpu(); }

}  // namespace

TEST_CASE("NCCL communicator at world size 1: every collective is the identity on device buffers", "[cuda]") {
  skip_without_gpu();
  auto boot = mc::make_local_communicator();
  auto comm = mc::make_nccl_communicator(*boot, 0);
  CHECK(comm->backend_name() == "nccl");
  CHECK(comm->rank() == 0);
  CHECK(comm->world_size() == 1);
  CHECK(comm->local_rank() == 0);
  CHECK(comm->local_size() == 1);

  SECTION("all_reduce sum, max and avg of f16, bf16, f32, i32, i64 leave the buffer unchanged") {
    // 1M + 3 elements: more than one NCCL chunk, and an odd tail.
    const size_t n = (size_t{1} << 20) + 3;
    uint64_t seed = 1;
    for (DType dtype : {DType::f16, DType::bf16, DType::f32, DType::i32, DType::i64}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
        INFO(mix::dtype_name(dtype) << " " << mc::reduce_op_name(op));
        const std::vector<unsigned char> values = make_values(dtype, n, seed++);
        DeviceBuffer buf(values.size());
        buf.upload(values.data());
        comm->reset_bytes();
        comm->all_reduce(buf.ptr, n, dtype, op, Traffic::gradients);
        CHECK(buf.download() == values);
        CHECK(comm->bytes().grad_allreduce_bytes == n * mix::dtype_size(dtype));
        CHECK(comm->bytes().grad_allreduce_calls == 1);
        CHECK(comm->bytes().other_bytes == 0);
      }
    }
  }

  SECTION("control traffic is counted apart from gradients; empty calls count zero bytes") {
    DeviceBuffer buf(sizeof(int32_t) * 7);
    const std::vector<int32_t> flags = {0, 1, 0, 0, 1, 1, 0};
    buf.upload(flags.data());
    comm->reset_bytes();
    comm->all_reduce(buf.ptr, flags.size(), DType::i32, ReduceOp::max, Traffic::control);
    comm->all_reduce(buf.ptr, 0, DType::f16, ReduceOp::sum, Traffic::gradients);
    comm->barrier();  // not counted, as with the MPI backend
    CHECK(comm->bytes().other_bytes == flags.size() * sizeof(int32_t));
    CHECK(comm->bytes().grad_allreduce_bytes == 0);
    CHECK(comm->bytes().grad_allreduce_calls == 1);
    std::vector<int32_t> got(flags.size());
    std::memcpy(got.data(), buf.download().data(), got.size() * sizeof(int32_t));
    CHECK(got == flags);
  }

  SECTION("broadcast from rank 0 keeps the bytes and counts them") {
    const size_t bytes = 1000003;
    const std::vector<unsigned char> values = make_values(DType::f16, bytes / 2 + 1, 77);
    DeviceBuffer buf(bytes);
    buf.upload(values.data());
    comm->reset_bytes();
    comm->broadcast(buf.ptr, bytes, 0);
    CHECK(buf.download() == std::vector<unsigned char>(values.begin(), values.begin() + bytes));
    CHECK(comm->bytes().other_bytes == bytes);
    CHECK_THROWS_WITH(comm->broadcast(buf.ptr, bytes, 1), Catch::Contains("not a rank"));
  }

  SECTION("all_gather copies this rank's block, out of place and in place") {
    const size_t bytes = 4099;
    const std::vector<unsigned char> values = make_values(DType::f32, bytes / 4 + 1, 99);
    const std::vector<unsigned char> block(values.begin(), values.begin() + bytes);
    DeviceBuffer send(bytes), recv(bytes);
    send.upload(block.data());
    const std::vector<unsigned char> zeros(bytes, 0);
    recv.upload(zeros.data());
    comm->reset_bytes();
    comm->all_gather(send.ptr, recv.ptr, bytes);
    CHECK(recv.download() == block);
    comm->all_gather(recv.ptr, recv.ptr, bytes);  // in place: rank 0's block is the whole buffer
    CHECK(recv.download() == block);
    CHECK(comm->bytes().other_bytes == 2 * bytes);
  }

  SECTION("broadcast_many leaves every device buffer as it is, as one group, and refuses host memory") {
    std::vector<std::vector<unsigned char>> values;
    std::vector<std::unique_ptr<DeviceBuffer>> bufs;
    std::vector<mc::ByteSpan> spans;
    for (size_t bytes : {size_t{256}, size_t{8}, size_t{4099}}) {
      values.push_back(make_values(DType::u8, bytes, 40 + bytes));
      bufs.push_back(std::make_unique<DeviceBuffer>(bytes));
      bufs.back()->upload(values.back().data());
      spans.push_back({bufs.back()->ptr, bytes});
    }
    comm->reset_bytes();
    comm->broadcast_many(spans, 0);
    for (size_t k = 0; k < bufs.size(); ++k) CHECK(bufs[k]->download() == values[k]);
    CHECK(comm->bytes().other_bytes == 256 + 8 + 4099);
    std::vector<unsigned char> host(16);
    CHECK_THROWS_WITH(comm->broadcast_many({{host.data(), host.size()}}, 0), Catch::Contains("host memory"));
    comm->broadcast_many(spans, 0);  // still usable: refused before anything was launched
  }

  SECTION("a host pointer is refused with a message, and the communicator still works after") {
    std::vector<float> host(16, 1.f);
    CHECK_THROWS_WITH(comm->all_reduce(host.data(), host.size(), DType::f32, ReduceOp::sum, Traffic::gradients),
                      Catch::Contains("host memory"));
    DeviceBuffer buf(sizeof(float) * host.size());
    buf.upload(host.data());
    comm->all_reduce(buf.ptr, host.size(), DType::f32, ReduceOp::sum, Traffic::gradients);
    std::vector<float> got(host.size());
    std::memcpy(got.data(), buf.download().data(), got.size() * sizeof(float));
    CHECK(got == host);
  }

  SECTION("the device communicator factory hands out the NCCL backend") {
    // The CUDA backend registers it at start, so callers need no #ifdef.
    comm.reset();
    auto via_factory = mc::make_device_communicator(*boot, 0);
    CHECK(via_factory->backend_name() == "nccl");
    via_factory->barrier();
  }
}

// The end of every GPU training step (an FP32 one has no blocking collective):
// synchronize() returns only when the compute stream's work and the started
// all-reduces are done, and under the watchdog, so work that never finishes
// ends in a timeout and an abort, not a hang.
TEST_CASE("NCCL synchronize: awaits the compute stream and started all-reduces, watched", "[cuda]") {
  skip_without_gpu();
  auto boot = mc::make_local_communicator();
  cudaStream_t compute = mix::cuda::context(0).compute.get();

  SECTION("returns once queued compute work and a started all-reduce are done") {
    auto comm = mc::make_nccl_communicator(*boot, 0);
    const size_t n = size_t{1} << 20;
    const std::vector<unsigned char> values = make_values(DType::f16, n, 7);
    DeviceBuffer buf(values.size());
    buf.upload(values.data());
    double hold = 0.3;
    REQUIRE(cudaLaunchHostFunc(compute, mix::testing::hold_stream, &hold) == cudaSuccess);
    // Ordered after the held compute stream on the device, like a gradient bucket after backward.
    const mc::Request r = comm->all_reduce_start(buf.ptr, n, DType::f16, ReduceOp::sum, Traffic::gradients);
    comm->wait(r);
    comm->synchronize();
    // Without the wait inside synchronize the compute stream would still be held here.
    CHECK(cudaStreamQuery(compute) == cudaSuccess);
    CHECK(cudaStreamQuery(mix::cuda::context(0).comm.get()) == cudaSuccess);
    CHECK(comm->in_flight() == 0);
    CHECK(buf.download() == values);
  }

  SECTION("work that outlasts MIX_NCCL_TIMEOUT_S ends in an abort that names synchronize") {
    // 0.5 s bounds the collectives' waits, not ncclCommInitRank's (at least 60 s:
    // NCCL's set-up alone can take longer than this on a large node).
    REQUIRE(setenv("MIX_NCCL_TIMEOUT_S", "0.5", 1) == 0);
    auto comm = mc::make_nccl_communicator(*boot, 0);  // reads the timeout now
    REQUIRE(unsetenv("MIX_NCCL_TIMEOUT_S") == 0);
    double hold = 3.0;
    REQUIRE(cudaLaunchHostFunc(compute, mix::testing::hold_stream, &hold) == cudaSuccess);
    // "no progress within" comes only from the watchdog's deadline.
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(comm->synchronize(), Catch::Contains("synchronize") && Catch::Contains("no progress within") &&
                                               Catch::Contains("aborted"));
    // The rank fails while the device is still held: 0.5 s of watching, then
    // ncclCommAbort, which may wait for the held stream, gets at most another
    // 0.5 s on its helper thread. 2.5 s leaves 1.5 s for polling and a loaded
    // host, and stays below the 3 s hold that an unbounded abort would wait out.
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 2.5);
    CHECK_THROWS_WITH(comm->barrier(), Catch::Contains("aborted after an earlier failure"));
    REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);  // `hold` must outlive the host function
  }
}

#else  // no CUDA in this build

TEST_CASE("NCCL communicator at world size 1", "[cuda]") {
  WARN("this build has no CUDA: skipped");
  std::exit(77);
}

#endif
