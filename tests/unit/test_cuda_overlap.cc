// [cuda] The CUDA half of overlapped gradient sync and overflow provenance,
// each against its CPU twin:
//  - check_finite_and_unscale / cast_check_finite_and_unscale with the
//    optional FoundInfiniteEach output (which X held an inf or NaN);
//  - c_allreduce_start + c_allreduce_wait over a world-size-1 NCCL
//    communicator (the CPU ops over the local communicator as the reference),
//    and NcclCommunicator::all_reduce_start / wait themselves;
//  - c_allreduce_found_inf over the NCCL communicator.
// At world size 1 every all-reduce is the identity, so the GPU and CPU results
// must match bit for bit: packing and unpacking are copies, and pre/post
// scaling is the same fn::Scale functor on both (a multiply and an add of 0,
// which an FMA contraction rounds the same way).
// Without a GPU (or in a build without CUDA) the test exits 77, which CTest
// reports as skipped, never as passed.
#include <catch2/catch.hpp>

#include "tests/unit/require_gpu.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "collective/communicator.h"
#include "runtime/core/check.h"
#include "runtime/core/device_backend.h"
#include "runtime/core/tensor.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "runtime/kernels/multi_tensor_plan.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"

#ifdef MIX_HAVE_CUDA
#include <cuda_runtime.h>

#include "collective/nccl_communicator.h"
#include "runtime/cuda/context.h"

using namespace mix;
using namespace mix::testing;
namespace mc = mix::collective;

namespace {

Tensor i32s(const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(s, DType::i32);
  REQUIRE(t.numel() == static_cast<int64_t>(v.size()));
  if (t.bytes() > 0) std::memcpy(t.raw(), v.data(), t.bytes());
  return t;
}

// Integers from -100 to 99 in an i32 or i64 tensor.
Tensor integer_tensor(const Shape& s, DType dtype, uint64_t seed) {
  const std::vector<float> v = random_tensor(s, DType::f32, seed, -100.f, 100.f).to_floats();
  Tensor t = Tensor::empty(s, dtype);
  for (size_t i = 0; i < v.size(); ++i) {
    const auto k = static_cast<int64_t>(std::floor(v[i]));
    if (dtype == DType::i32)
      t.data<int32_t>()[i] = static_cast<int32_t>(k);
    else
      t.data<int64_t>()[i] = k;
  }
  return t;
}

std::vector<int32_t> ints(const Tensor& t) {
  REQUIRE(t.dtype() == DType::i32);
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  if (t.bytes() > 0) std::memcpy(v.data(), t.raw(), t.bytes());
  return v;
}

// Ops run in order on `device` over fresh copies of the feeds, with `comm` as
// ExecEnv::comm; returns `results` on the host. The executor itself fails when
// a start is left without its wait; the communicator must have none in flight either.
std::map<std::string, Tensor> run_ops(const std::vector<OpDesc>& ops,
                                      const std::vector<std::pair<std::string, Tensor>>& feeds, Device device,
                                      mc::Communicator& comm, const std::vector<std::string>& results) {
  ExecEnv env;
  env.comm = &comm;
  env.rank = comm.rank();
  env.progress = [&comm] { comm.progress(); };
  std::map<std::string, Tensor> out = run_ops_on(ops, feeds, device, env, results);
  CHECK(comm.in_flight() == 0);
  return out;
}

// 140 gradient-like shapes up to 18000 elements (shared launches, more than
// one table of kMaxTensors), two of them empty and one of 16384 * 320 + 5
// elements (over kLargeTensor: launched alone).
std::vector<Shape> many_shapes() {
  std::vector<Shape> shapes;
  for (int64_t i = 0; i < 140; ++i) shapes.push_back(i == 40 || i == 41 ? Shape{0} : Shape{(i * 613) % 9000 + 1, 2});
  static_assert(multi_tensor::kMaxTensors < 140 - 3, "the shared tensors must need two tables");
  shapes[70] = {16384 * 320 + 5};
  static_assert(16384 * 320 + 5 > multi_tensor::kLargeTensor, "shape 70 must be launched alone");
  return shapes;
}

// The world-size-1 NCCL communicator on GPU 0 and its bootstrap.
struct Nccl1 {
  std::unique_ptr<mc::Communicator> boot = mc::make_local_communicator();
  std::unique_ptr<mc::Communicator> comm = mc::make_nccl_communicator(*boot, 0);
};

// check_finite_and_unscale, or with `fused` its cast twin, of the tensors fed
// as X (names g0, g1, ...; `feeds` holds them and "scale") with
// FoundInfiniteEach, on the GPU and the CPU: every output identical (flags are
// integers; the unscaled values the same multiply, one rounding on store).
// Returns the GPU's FoundInfiniteEach and FoundInfinite.
std::pair<std::vector<int32_t>, int32_t> unscale_on_both(bool fused, const std::vector<std::string>& xn,
                                                         const std::vector<std::pair<std::string, Tensor>>& feeds,
                                                         const std::string& what) {
  std::vector<std::string> outn;
  for (auto& x : xn) outn.push_back(fused ? x + "_f32" : x);
  const std::string type = fused ? "cast_check_finite_and_unscale" : "check_finite_and_unscale";
  const OneOp c{make_op(type, {{"X", xn}, {"Scale", {"scale"}}},
                        {{"Out", outn}, {"FoundInfinite", {"found"}}, {"FoundInfiniteEach", {"each"}}}),
                feeds};
  std::vector<std::string> results = outn;
  results.push_back("found");
  results.push_back("each");
  const Both r = run_both(c, results);
  expect_identical(r.gpu.at("each"), r.cpu.at("each"), type + " " + what + " FoundInfiniteEach");
  expect_identical(r.gpu.at("found"), r.cpu.at("found"), type + " " + what + " FoundInfinite");
  for (auto& o : outn) expect_identical(r.gpu.at(o), r.cpu.at(o), type + " " + what + " " + o);
  return {ints(r.gpu.at("each")), ints(r.gpu.at("found"))[0]};
}

}  // namespace

// ---- FoundInfiniteEach ----------------------------------------------------------------------

TEST_CASE("check_finite_and_unscale on CUDA: FoundInfiniteEach flags the same tensors as the CPU",
          "[cuda][amp][overlap]") {
  require_gpu();
  const float inf = std::numeric_limits<float>::infinity();
  // Which of the five X hold a non-finite value: none, one inf, a NaN and a
  // -inf in two tensors, every non-empty one. X[3] is empty: its flag stays 0.
  const std::vector<std::vector<int>> patterns = {{}, {1}, {0, 4}, {0, 1, 2, 4}};
  const Shape shapes[] = {{1000}, {37, 5}, {70000}, {0}, {3}};  // 70000: many blocks, the bad one in the last
  for (DType dtype : {DType::f32, DType::f16})
    for (bool fused : {false, true})
      for (const auto& bad : patterns) {
        std::vector<std::pair<std::string, Tensor>> feeds{{"scale", Tensor::from_floats({1}, {1024.f})}};
        std::vector<std::string> xn;
        std::vector<int32_t> expected(std::size(shapes), 0);
        for (size_t i = 0; i < std::size(shapes); ++i) {
          Tensor x = random_tensor(shapes[i], DType::f32, 200 + i, -6e4f, 6e4f);
          std::vector<float> v = x.to_floats();
          for (int b : bad)
            if (static_cast<size_t>(b) == i && !v.empty()) {
              v[v.size() - 1 - (i % v.size())] = i % 2 ? std::nanf("") : (i == 0 ? -inf : inf);
              expected[i] = 1;
            }
          xn.push_back(numbered("g", i));
          feeds.push_back({xn.back(), floats(shapes[i], v, dtype)});
        }
        std::string what = dname(dtype) + " bad {";
        for (int b : bad) {
          what += std::to_string(b);
          what += " ";
        }
        what += "}";
        const auto [each, found] = unscale_on_both(fused, xn, feeds, what);
        INFO((fused ? "fused " : "") << what);
        CHECK(each == expected);
        CHECK(found == (bad.empty() ? 0 : 1));
      }
}

TEST_CASE("check_finite_and_unscale on CUDA: FoundInfiniteIn raises FoundInfinite, not FoundInfiniteEach",
          "[cuda][amp][overlap]") {
  require_gpu();
  const OneOp c{make_op("check_finite_and_unscale",
                        {{"X", {"g0", "g1"}}, {"Scale", {"scale"}}, {"FoundInfiniteIn", {"found_in"}}},
                        {{"Out", {"g0", "g1"}}, {"FoundInfinite", {"found"}}, {"FoundInfiniteEach", {"each"}}}),
                {{"scale", Tensor::from_floats({1}, {8.f})},
                 {"found_in", i32s({1}, {1})},
                 {"g0", random_tensor({64}, DType::f32, 1)},
                 {"g1", random_tensor({65}, DType::f16, 2)}}};
  const Both r = run_both(c, {"found", "each"});
  expect_identical(r.gpu.at("each"), r.cpu.at("each"), "FoundInfiniteEach");
  CHECK(ints(r.gpu.at("each")) == std::vector<int32_t>{0, 0});
  CHECK(ints(r.gpu.at("found"))[0] == 1);
}

TEST_CASE("check_finite_and_unscale on CUDA: a long list of two dtypes, across several multi-tensor launches",
          "[cuda][amp][overlap]") {
  require_gpu();
  // 300 tensors, f32 and f16 interleaved (two groups of 150, each over more
  // than one shared launch's table of kMaxTensors, 128; 6 of the f16 ones
  // empty), sizes from empty to a large one launched alone (tensor 7, more
  // than 5M elements); non-finite values in the last chunk of the large one,
  // in f16 tensors of the first and the second shared launch (61, and 299:
  // the last tensor, after 142 shared f16 ones), and in an f32 tensor of its
  // group's second shared launch (280, after 140 shared f32 ones).
  static_assert(multi_tensor::kMaxTensors < 140, "the bad tensors 280 and 299 must be in a second table");
  static_assert(16384 * 320 + 77 > multi_tensor::kLargeTensor, "tensor 7 must be launched alone");
  const float inf = std::numeric_limits<float>::infinity();
  const size_t count = 300;
  const std::set<size_t> bad = {7, 61, 280, 299};
  for (bool fused : {false, true}) {
    std::vector<std::pair<std::string, Tensor>> feeds{{"scale", Tensor::from_floats({1}, {4096.f})}};
    std::vector<std::string> xn;
    std::vector<int32_t> expected(count, 0);
    for (size_t i = 0; i < count; ++i) {
      const int64_t n = i == 7 ? 16384 * 320 + 77 : i % 50 == 3 ? 0 : static_cast<int64_t>((i * 7919) % 40000 + 1);
      const DType dtype = i % 2 ? DType::f16 : DType::f32;
      std::vector<float> v = random_tensor({n}, DType::f32, 500 + i, -6e4f, 6e4f).to_floats();
      if (bad.count(i)) {
        v.back() = i == 61 ? std::nanf("") : inf;
        expected[i] = 1;
      }
      xn.push_back(numbered("g", i));
      feeds.push_back({xn.back(), floats({n}, v, dtype)});
    }
    const auto [each, found] = unscale_on_both(fused, xn, feeds, "300 tensors");
    INFO((fused ? "fused" : "unfused"));
    CHECK(each == expected);
    CHECK(found == 1);
  }
}

// ---- c_allreduce_start / c_allreduce_wait ------------------------------------------------------

TEST_CASE("c_allreduce_start + c_allreduce_wait on CUDA (NCCL, world 1) match the CPU ops", "[cuda][overlap]") {
  require_gpu();
  Nccl1 nccl;
  auto local = mc::make_local_communicator();
  struct Case {
    std::vector<Shape> shapes;
    double prescale, postscale;
  };
  // Several tensors (packed into a Buffer) and one (the Buffer is a view of it,
  // reduced in place); scaling that rounds (1/3) and that does not.
  const Case cases[] = {{{{1000}, {37, 5}, {3}, {4099}}, 0.25, 3.0},
                        {{{1000}, {37, 5}, {3}, {4099}}, 1.0 / 3.0, 2.0},
                        {{{1000}, {37, 5}, {3}, {4099}}, 1.0, 1.0},
                        {{{129, 3}}, 0.5, 1.0 / 3.0},
                        {{{129, 3}}, 1.0, 1.0},
                        // Past one multi-tensor launch: more tensors than its table (128), and
                        // one large enough to be launched alone.
                        {many_shapes(), 0.25, 3.0},
                        {many_shapes(), 1.0, 1.0}};
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const Case& k : cases) {
      std::vector<std::pair<std::string, Tensor>> feeds;
      std::vector<std::string> xn;
      for (size_t i = 0; i < k.shapes.size(); ++i) {
        xn.push_back(numbered("g", i));
        feeds.push_back({xn.back(), random_tensor(k.shapes[i], dtype, 300 + i, -100.f, 100.f)});
      }
      const std::vector<OpDesc> ops = {make_op("c_allreduce_start", {{"X", xn}}, {{"Buffer", {"bucket0"}}},
                                               {{"prescale", k.prescale}, {"traffic", std::string("gradients")}}),
                                       make_op("c_allreduce_wait", {{"Buffer", {"bucket0"}}}, {{"Out", xn}},
                                               {{"postscale", k.postscale}, {"traffic", std::string("gradients")}})};
      nccl.comm->reset_bytes();
      const auto gpu = run_ops(ops, feeds, kGpu, *nccl.comm, xn);
      const auto cpu = run_ops(ops, feeds, cpu_device(), *local, xn);
      const std::string what = dname(dtype) + " bucket of " + std::to_string(k.shapes.size()) + ", prescale " +
                               std::to_string(k.prescale) + ", postscale " + std::to_string(k.postscale);
      for (auto& x : xn) expect_identical(gpu.at(x), cpu.at(x), what + " " + x);
      size_t bytes = 0;
      for (auto& [name, t] : feeds) bytes += t.bytes();
      CHECK(nccl.comm->bytes().grad_allreduce_bytes == bytes);
      CHECK(nccl.comm->bytes().grad_allreduce_calls == 1);
      // Scaling really happened (the reference is not the input handed back).
      if (k.prescale * k.postscale != 1.0) {
        INFO(what);
        const Tensor& x0 = feeds[0].second;
        CHECK(cpu.at(xn[0]).item_float(0) != x0.item_float(0));
      }
    }
}

TEST_CASE("c_allreduce_sum / c_allreduce_max on CUDA (NCCL, world 1) match the CPU ops, integer buckets too",
          "[cuda][collective]") {
  require_gpu();
  Nccl1 nccl;
  auto local = mc::make_local_communicator();
  const std::vector<Shape> several = {{1000}, {37, 5}, {0}, {4099}}, one = {{129, 3}};
  for (const char* type : {"c_allreduce_sum", "c_allreduce_max"})
    for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64})
      for (const auto* shapes : {&several, &one}) {
        const bool floating = dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16;
        const bool scaled = floating && std::string(type) == "c_allreduce_sum";
        std::vector<std::pair<std::string, Tensor>> feeds;
        std::vector<std::string> xn;
        for (size_t i = 0; i < shapes->size(); ++i) {
          xn.push_back(numbered("g", i));
          feeds.push_back({xn.back(), floating ? random_tensor((*shapes)[i], dtype, 700 + i, -100.f, 100.f)
                                               : integer_tensor((*shapes)[i], dtype, 700 + i)});
        }
        std::map<std::string, Attr> attrs{{"traffic", std::string("gradients")}};
        if (scaled) {
          attrs["prescale"] = 0.25;
          attrs["postscale"] = 3.0;
        }
        const std::vector<OpDesc> ops = {make_op(type, {{"X", xn}}, {{"Out", xn}}, attrs)};
        const auto gpu = run_ops(ops, feeds, kGpu, *nccl.comm, xn);
        const auto cpu = run_ops(ops, feeds, cpu_device(), *local, xn);
        const std::string what =
            std::string(type) + " " + dname(dtype) + " bucket of " + std::to_string(shapes->size());
        for (auto& x : xn) expect_identical(gpu.at(x), cpu.at(x), what + " " + x);
        INFO(what);
        // The world-1 reduction is the identity: the input comes back, times 0.75 when scaled.
        const Tensor& x0 = feeds[0].second;
        const double expected = scaled ? 0.75 * x0.item_float(0) : x0.item_float(0);
        CHECK(std::fabs(cpu.at(xn[0]).item_float(0) - expected) <= 0.01 * std::fabs(expected) + 1e-6);
      }
  // Max takes no scaling, on either device.
  const std::vector<OpDesc> scaled_max = {
      make_op("c_allreduce_max", {{"X", {"g0"}}}, {{"Out", {"g0"}}}, {{"prescale", 0.5}})};
  const std::vector<std::pair<std::string, Tensor>> feed = {{"g0", random_tensor({8}, DType::f32, 9)}};
  CHECK_THROWS_WITH(run_ops(scaled_max, feed, kGpu, *nccl.comm, {"g0"}), Catch::Contains("only sums"));
  CHECK_THROWS_WITH(run_ops(scaled_max, feed, cpu_device(), *local, {"g0"}), Catch::Contains("only sums"));
}

TEST_CASE("c_allreduce_wait on CUDA without its start throws; the communicator names unknown requests",
          "[cuda][overlap]") {
  require_gpu();
  Nccl1 nccl;
  const std::vector<std::pair<std::string, Tensor>> feeds = {{"bucket0", random_tensor({16}, DType::f32, 5)},
                                                             {"g0", random_tensor({16}, DType::f32, 6)}};
  const std::vector<OpDesc> wait_only = {make_op("c_allreduce_wait", {{"Buffer", {"bucket0"}}}, {{"Out", {"g0"}}})};
  CHECK_THROWS_WITH(run_ops(wait_only, feeds, kGpu, *nccl.comm, {"g0"}),
                    Catch::Contains("no all-reduce of bucket0 is in flight"));
  CHECK_THROWS_WITH(nccl.comm->wait(987654), Catch::Contains("987654"));
  CHECK(nccl.comm->in_flight() == 0);
}

TEST_CASE("NCCL all_reduce_start / wait at world size 1: identity, counted, each request waited for once",
          "[cuda][overlap]") {
  require_gpu();
  const Tensor host = random_tensor({(1 << 20) + 3}, DType::f16, 9, -1000.f, 1000.f);
  // Before the communicator, so that they outlive it (its destructor flushes
  // the start left unwaited at the end).
  const Tensor a = host.to(kGpu), b = host.to(kGpu);
  Nccl1 nccl;
  mc::Communicator& comm = *nccl.comm;
  comm.reset_bytes();
  const mc::Request ra = comm.all_reduce_start(a.raw(), static_cast<size_t>(a.numel()), DType::f16, mc::ReduceOp::sum,
                                               mc::Traffic::gradients);
  const mc::Request rb = comm.all_reduce_start(b.raw(), static_cast<size_t>(b.numel()), DType::f16, mc::ReduceOp::avg,
                                               mc::Traffic::gradients);
  const mc::Request re = comm.all_reduce_start(nullptr, 0, DType::f32, mc::ReduceOp::sum, mc::Traffic::control);
  CHECK(ra != rb);
  CHECK(comm.in_flight() == 3);
  comm.progress();
  comm.wait(rb);
  comm.wait(re);
  comm.wait(ra);
  CHECK(comm.in_flight() == 0);
  CHECK_THROWS_WITH(comm.wait(ra), Catch::Contains(std::to_string(ra)));
  CHECK(comm.bytes().grad_allreduce_bytes == 2 * host.bytes());
  CHECK(comm.bytes().grad_allreduce_calls == 2);
  // The results are read on the host through the compute stream's order (wait
  // made it wait for the collectives), as the step's kernels would see them.
  expect_identical(a.to(cpu_device()), host, "sum, world 1");
  expect_identical(b.to(cpu_device()), host, "avg, world 1");
  // A host pointer is refused at the start, and nothing is left in flight.
  std::vector<float> h(8, 1.f);
  CHECK_THROWS_WITH(comm.all_reduce_start(h.data(), h.size(), DType::f32, mc::ReduceOp::sum),
                    Catch::Contains("host memory"));
  CHECK(comm.in_flight() == 0);
  // A start forgotten (a failed recording's: collective::forget_started) is
  // gone without a wait, once; the communicator goes on as before.
  const mc::Request rf = comm.all_reduce_start(a.raw(), 16, DType::f16, mc::ReduceOp::sum);
  CHECK(comm.in_flight() == 1);
  comm.forget(rf);
  CHECK(comm.in_flight() == 0);
  CHECK_THROWS_WITH(comm.forget(rf), Catch::Contains("forget all-reduce request " + std::to_string(rf) + " "));
  CHECK_THROWS_WITH(comm.wait(rf), Catch::Contains("wait for all-reduce request " + std::to_string(rf) + " "));
  // The communicator still works: a start left unwaited is dropped with it.
  comm.all_reduce_start(a.raw(), 16, DType::f16, mc::ReduceOp::sum);
  CHECK(comm.in_flight() == 1);
}

// --cuda-graph's fallback (launch/step_runner.cc): a recording refused after an
// all-reduce was started leaves it to collective::forget_started. The
// communication stream, drawn into the capture by the start, must be out of
// it again, and the communicator must go on as if nothing had been started.
TEST_CASE("NCCL: an all-reduce started in a recording that failed is forgotten, and the communicator goes on",
          "[cuda][overlap]") {
  require_gpu();
#ifdef MIX_HAVE_CUDA
  const Tensor host = random_tensor({4099}, DType::f16, 21, -100.f, 100.f);
  const Tensor a = host.to(kGpu);
  Nccl1 nccl;
  mc::Communicator& comm = *nccl.comm;
  mix::cuda::DeviceContext& ctx = mix::cuda::use_device(0);
  std::unique_ptr<mix::DeviceGraph> graph = mix::require_device_backend(mix::DeviceKind::cuda).make_graph(0);
  REQUIRE(graph);
  mc::Request started = 0;
  // Refused part-way, after the start: by CUDA (a host wait for the stream
  // being recorded invalidates the capture), or by an error of mixtrain's own
  // (an op's check), which leaves the communication stream forked into a
  // capture that is still active.
  const bool invalidated = GENERATE(true, false);
  INFO((invalidated ? "a host wait invalidated the capture" : "an error stopped the step, the capture still active"));
  CHECK_THROWS_AS(graph->record([&] {
    started = comm.all_reduce_start(a.raw(), static_cast<size_t>(a.numel()), DType::f16, mc::ReduceOp::sum,
                                    mc::Traffic::gradients);
    if (invalidated) ctx.compute.synchronize();
    MIX_FAIL("an op's check failed while recording");
  }),
                  mix::RecordingError);
  for (cudaStream_t s : {ctx.compute.get(), ctx.comm.get()}) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    CHECK(cudaStreamIsCapturing(s, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusNone);
  }
  REQUIRE(started != 0);
  CHECK(comm.in_flight() == 1);
  comm.forget(started);
  CHECK(comm.in_flight() == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
  // Then as without the recording: a start, its wait, the whole queue awaited, the result on the host.
  const mc::Request r = comm.all_reduce_start(a.raw(), static_cast<size_t>(a.numel()), DType::f16, mc::ReduceOp::sum,
                                              mc::Traffic::gradients);
  comm.wait(r);
  comm.synchronize();
  CHECK(comm.in_flight() == 0);
  expect_identical(a.to(cpu_device()), host, "sum at world 1 after a forgotten start");
#endif
}

// ---- c_allreduce_found_inf ---------------------------------------------------------------------

TEST_CASE("c_allreduce_found_inf on CUDA (NCCL, world 1) matches the CPU op", "[cuda][overlap][amp]") {
  require_gpu();
  Nccl1 nccl;
  auto local = mc::make_local_communicator();
  struct Case {
    std::vector<int32_t> flags;              // FoundInfinite of each bucket
    std::vector<std::vector<int32_t>> each;  // FoundInfiniteEach of each bucket (empty: the slot is absent)
    int64_t world_size;                      // attr: ranks the mask has room for
  };
  const Case cases[] = {
      {{0, 0}, {{0, 0, 0}, {0, 0}}, 1},
      {{1, 0}, {{0, 1, 0}, {0, 0}}, 1},
      {{0, 1}, {{0, 0, 0}, {1, 1}}, 1},
      {{1, 1}, {{1, 0, 1}, {0, 1}}, 40},  // two words per row
      {{1, 0, 0}, {}, 1},                 // flags only (FoundInfiniteIn raised them)
      {{0, 0, 0}, {}, 64},
      {{1}, {{1}}, 1},
  };
  for (const Case& k : cases) {
    std::vector<std::pair<std::string, Tensor>> feeds;
    std::vector<std::string> flags, each, params;
    for (size_t b = 0; b < k.flags.size(); ++b) {
      flags.push_back(numbered("found", b));
      feeds.push_back({flags.back(), i32s({1}, {k.flags[b]})});
      if (k.each.empty()) continue;
      each.push_back(numbered("each", b));
      const auto& e = k.each[b];
      feeds.push_back({each.back(), i32s({static_cast<int64_t>(e.size())}, e)});
      std::string prefix = numbered("p", b);
      prefix += "_";
      for (size_t i = 0; i < e.size(); ++i) params.push_back(numbered(prefix.c_str(), i));
    }
    std::map<std::string, std::vector<std::string>> ins{{"FoundInfinite", flags}};
    if (!each.empty()) ins["FoundInfiniteEach"] = each;
    const std::vector<OpDesc> ops = {make_op("c_allreduce_found_inf", ins,
                                             {{"Out", {"found_inf"}}, {"OverflowRanks", {"overflow_ranks"}}},
                                             {{"params", params}, {"world_size", k.world_size}})};
    const auto gpu = run_ops(ops, feeds, kGpu, *nccl.comm, {"found_inf", "overflow_ranks"});
    const auto cpu = run_ops(ops, feeds, cpu_device(), *local, {"found_inf", "overflow_ranks"});
    std::string what = "flags";
    for (int32_t f : k.flags) {
      what += " ";
      what += std::to_string(f);
    }
    what += ", world_size ";
    what += std::to_string(k.world_size);
    expect_identical(gpu.at("found_inf"), cpu.at("found_inf"), what + " Out");
    expect_identical(gpu.at("overflow_ranks"), cpu.at("overflow_ranks"), what + " OverflowRanks");
    // Exact values: rank 0 is bit 0 of word 0 of each raised row.
    INFO(what);
    const int words = static_cast<int>((k.world_size + 31) / 32);
    std::vector<int32_t> mask;
    bool any = false;
    for (int32_t f : k.flags) any = any || f != 0;
    mask.push_back(any ? 1 : 0);
    for (int w = 1; w < words; ++w) mask.push_back(0);
    for (const auto& e : k.each)
      for (int32_t v : e) {
        mask.push_back(v ? 1 : 0);
        for (int w = 1; w < words; ++w) mask.push_back(0);
      }
    CHECK(ints(gpu.at("overflow_ranks")) == mask);
    CHECK(ints(gpu.at("found_inf"))[0] == (any ? 1 : 0));
  }
}

#else  // no CUDA in this build

TEST_CASE("overlapped gradient sync and overflow provenance on CUDA", "[cuda]") {
  WARN("this build has no CUDA: skipped");
  std::exit(77);
}

#endif
