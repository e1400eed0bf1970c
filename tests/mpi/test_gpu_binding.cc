// GPU binding and the NCCL communicator under MPI (2 and 4 ranks).
//
// bind_device either succeeds on every rank (each rank gets the GPU of its
// local rank, and the gathered table is in rank order) or fails on every rank
// with the same CollectiveError, naming the host (more ranks than GPUs: the
// case on a machine without GPUs, or with fewer GPUs than ranks). Where it
// succeeds, the NCCL communicator is built over MPI and checked with
// closed-form values (rank r contributes r + 1). A build without CUDA checks
// that asking for a GPU fails on every rank with a message saying so. Where
// the GPU parts cannot run, the run reports skipped (exit 77), not passed.
#include "tests/mpi/mpi_test_main.h"
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/consistency.h"
#include "runtime/core/check.h"

#ifdef MIX_HAVE_CUDA
#include <cuda_runtime.h>

#include "collective/device_binding.h"
#endif

using namespace mix;
using namespace mix::collective;

static Communicator* g_comm = nullptr;

namespace {

// The values of `mine` on every rank, in rank order (over the host communicator).
template <typename T>
std::vector<T> gather(const T& mine) {
  std::vector<T> all(static_cast<size_t>(g_comm->world_size()));
  g_comm->all_gather(&mine, all.data(), sizeof(T));
  return all;
}

}  // namespace

#ifdef MIX_HAVE_CUDA

namespace {
// Set by the binding test when every rank got a GPU: the NCCL test runs then.
int g_device = -1;
}  // namespace

TEST_CASE("binding succeeds on every rank with the GPU of its local rank, or fails on every rank alike", "[binding]") {
  Communicator& c = *g_comm;
  std::vector<GpuBinding> table;
  std::string error;
  int device = -1;
  try {
    device = bind_local_gpu(c, &table);
  } catch (const CollectiveError& e) {
    error = e.what();
  }
  const int32_t failed = error.empty() ? 0 : 1;
  const auto outcomes = gather(failed);
  for (int32_t o : outcomes) CHECK(o == failed);  // no rank went on while another stopped
  if (failed) {
    INFO(error);
    CHECK_THAT(error, Catch::Contains(" on host "));
    CHECK_THAT(error, Catch::Contains("visible (CUDA_VISIBLE_DEVICES=") || Catch::Contains("would share GPU"));
    // Every rank saw the same table, so every rank reports the same message.
    const uint64_t h = std::hash<std::string>{}(error);
    for (uint64_t other : gather(h)) CHECK(other == h);
    mix::testing::skip_part("no GPU for each of the " + std::to_string(c.world_size()) +
                            " ranks here: the NCCL communicator is not tested");
    return;
  }
  CHECK(device == c.local_rank());
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  CHECK(current == device);
  REQUIRE(table.size() == static_cast<size_t>(c.world_size()));
  for (size_t r = 0; r < table.size(); ++r) {
    CHECK(table[r].rank == static_cast<int>(r));
    CHECK(table[r].device == table[r].local_rank);
    CHECK_FALSE(table[r].pci_bus_id.empty());
  }
  g_device = device;
}

TEST_CASE("NCCL over MPI: all_reduce, broadcast and all_gather give the closed-form values", "[binding][cuda]") {
  if (g_device < 0) return;  // skip_part above said why
  Communicator& c = *g_comm;
  const int world = c.world_size(), rank = c.rank();
  auto nccl = make_device_communicator(c, g_device);
  CHECK(nccl->backend_name() == "nccl");
  CHECK(nccl->rank() == rank);
  CHECK(nccl->world_size() == world);

  const size_t n = 1000;
  std::vector<float> host(n, static_cast<float>(rank + 1));
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the DMA has landed before NCCL reads it
  nccl->all_reduce(d, n, DType::f32, ReduceOp::sum, Traffic::gradients);
  REQUIRE(cudaMemcpy(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  const float sum = static_cast<float>(world * (world + 1) / 2);
  for (float v : host) CHECK(v == sum);

  std::vector<int32_t> flag(1, rank == world - 1 ? 1 : 0);
  int32_t* df = nullptr;
  REQUIRE(cudaMalloc(&df, sizeof(int32_t) * static_cast<size_t>(world)) == cudaSuccess);
  REQUIRE(cudaMemcpy(df, flag.data(), sizeof(int32_t), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the DMA has landed before NCCL reads it
  nccl->all_reduce(df, 1, DType::i32, ReduceOp::max, Traffic::control);
  REQUIRE(cudaMemcpy(flag.data(), df, sizeof(int32_t), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(flag[0] == 1);

  int32_t mine = 100 + rank;
  REQUIRE(cudaMemcpy(df, &mine, sizeof(int32_t), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the DMA has landed before NCCL reads it
  nccl->broadcast(df, sizeof(int32_t), world - 1);
  REQUIRE(cudaMemcpy(&mine, df, sizeof(int32_t), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(mine == 100 + world - 1);

  int32_t* dg = nullptr;
  REQUIRE(cudaMalloc(&dg, sizeof(int32_t) * static_cast<size_t>(world)) == cudaSuccess);
  mine = 10 * rank;
  REQUIRE(cudaMemcpy(df, &mine, sizeof(int32_t), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the DMA has landed before NCCL reads it
  nccl->all_gather(df, dg, sizeof(int32_t));
  std::vector<int32_t> all(static_cast<size_t>(world));
  REQUIRE(cudaMemcpy(all.data(), dg, all.size() * sizeof(int32_t), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int r = 0; r < world; ++r) CHECK(all[static_cast<size_t>(r)] == 10 * r);
  nccl->barrier();

  CHECK(nccl->bytes().grad_allreduce_bytes == n * sizeof(float));
  CHECK(nccl->bytes().grad_allreduce_calls == 1);
  CHECK(nccl->bytes().other_bytes == 3 * sizeof(int32_t));
  cudaFree(d);
  cudaFree(df);
  cudaFree(dg);
}

TEST_CASE("a collective that the other ranks never join times out, aborts NCCL and names the rank", "[binding][cuda]") {
  if (g_device < 0) return;
  Communicator& c = *g_comm;
  // Read when the communicator is made: a short watchdog for this one.
  REQUIRE(setenv("MIX_NCCL_TIMEOUT_S", "3", 1) == 0);
  auto nccl = make_device_communicator(c, g_device);
  REQUIRE(unsetenv("MIX_NCCL_TIMEOUT_S") == 0);
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, sizeof(float)) == cudaSuccess);
  if (c.rank() == 0) {
    std::string error;
    try {
      nccl->all_reduce(d, 1, DType::f32, ReduceOp::sum, Traffic::gradients);
    } catch (const Error& e) {
      error = e.what();
    }
    INFO(error);
    CHECK_THAT(error, Catch::Contains("all_reduce (sum of 1 f32"));
    CHECK_THAT(error, Catch::Contains("no progress within 3 s"));
    CHECK_THAT(error, Catch::Contains("rank 0/"));
    CHECK_THAT(error, Catch::Contains("NCCL_DEBUG=INFO"));
    CHECK_THAT(error, Catch::Contains("aborted"));
    // Every later call fails at once, naming the first failure.
    CHECK_THROWS_WITH(nccl->barrier(), Catch::Contains("aborted after an earlier failure"));
  }
  c.barrier();  // over MPI: the other ranks wait here until rank 0 has timed out
  // Rank 0 aborted; the others finalize, which gives up after the timeout and aborts.
  nccl.reset();
  CHECK(cudaFree(d) == cudaSuccess);  // the CUDA context survives an NCCL abort
}

#else  // no CUDA in this build

TEST_CASE("without CUDA, asking for a GPU fails on every rank with a message", "[binding]") {
  std::string error;
  try {
    bind_device(*g_comm);
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK_THAT(error, Catch::Contains("no CUDA backend"));
  CHECK_THROWS_WITH(make_device_communicator(*g_comm, 0), Catch::Contains("no device communicator"));
  // What this file is for, binding and NCCL, needs a CUDA build.
  mix::testing::skip_part("this build has no CUDA: GPU binding and the NCCL communicator are not tested");
}

#endif

int main(int argc, char** argv) { return mix::testing::run_mpi_tests(argc, argv, "test_gpu_binding", g_comm); }
