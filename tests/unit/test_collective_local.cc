// Tests of the single-process communicator and of reduce_into, the elementwise
// reduction every backend shares (the MPI user-defined ops call it per hop).
//
// Expected values are written out by hand: FP16 has an 11-bit significand, so
// between 2048 and 4096 its spacing is 2 and 2048 + 1 is a tie that rounds to
// the even 2048; between 65504 and the overflow threshold 65520 values round
// down, at 65520 and above they become inf. BF16 has an 8-bit significand:
// spacing 2 between 256 and 512.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "runtime/core/check.h"
#include "runtime/core/half.h"

namespace {

using mix::DType;
using mix::collective::ReduceOp;
using mix::collective::Traffic;
namespace mc = mix::collective;

uint16_t h(float f) { return mix::float_to_half_bits(f); }
float hf(uint16_t b) { return mix::half_bits_to_float(b); }
uint16_t bf(float f) { return mix::float_to_bf16_bits(f); }
float bff(uint16_t b) { return mix::bf16_bits_to_float(b); }

// One hop: a (inout) combined with b (in), in f16.
float f16_hop(float a, float b, ReduceOp op) {
  uint16_t x = h(a);
  const uint16_t y = h(b);
  mc::reduce_into(&x, &y, 1, DType::f16, op);
  return hf(x);
}
float bf16_hop(float a, float b, ReduceOp op) {
  uint16_t x = bf(a);
  const uint16_t y = bf(b);
  mc::reduce_into(&x, &y, 1, DType::bf16, op);
  return bff(x);
}

// Sets or clears an environment variable for one scope, then restores it.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~EnvGuard() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

const char* const kLauncherVars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};

}  // namespace

TEST_CASE("reduce_op_name", "[collective]") {
  CHECK(mc::reduce_op_name(ReduceOp::sum) == "sum");
  CHECK(mc::reduce_op_name(ReduceOp::max) == "max");
  CHECK(mc::reduce_op_name(ReduceOp::avg) == "avg");
}

TEST_CASE("reduce_into f32 and integers combine natively", "[collective]") {
  SECTION("f32 sum, max, and avg adds like sum") {
    std::vector<float> a = {1.5f, -2.0f, 1e30f, 0.0f};
    const std::vector<float> b = {2.25f, -3.0f, 1e30f, -0.0f};
    auto s = a;
    mc::reduce_into(s.data(), b.data(), s.size(), DType::f32, ReduceOp::sum);
    CHECK(s == std::vector<float>{3.75f, -5.0f, 2e30f, 0.0f});
    auto v = a;
    mc::reduce_into(v.data(), b.data(), v.size(), DType::f32, ReduceOp::avg);
    CHECK(v == s);  // the 1/world multiply is the backend's, after the whole reduction
    auto m = a;
    mc::reduce_into(m.data(), b.data(), m.size(), DType::f32, ReduceOp::max);
    CHECK(m == std::vector<float>{2.25f, -2.0f, 1e30f, 0.0f});
  }
  SECTION("f32 max keeps NaN and prefers +0 whatever the order") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    float x = nan, y = 1.0f;
    mc::reduce_into(&x, &y, 1, DType::f32, ReduceOp::max);
    CHECK(std::isnan(x));
    x = 1.0f;
    y = nan;
    mc::reduce_into(&x, &y, 1, DType::f32, ReduceOp::max);
    CHECK(std::isnan(x));
    x = -0.0f;
    y = 0.0f;
    mc::reduce_into(&x, &y, 1, DType::f32, ReduceOp::max);
    CHECK_FALSE(std::signbit(x));
    x = 0.0f;
    y = -0.0f;
    mc::reduce_into(&x, &y, 1, DType::f32, ReduceOp::max);
    CHECK_FALSE(std::signbit(x));
  }
  SECTION("i32 sum and max, exact; sums wrap like MPI_SUM") {
    std::vector<int32_t> a = {1, -7, 100000, std::numeric_limits<int32_t>::max()};
    const std::vector<int32_t> b = {2, 3, -100001, 1};
    auto s = a;
    mc::reduce_into(s.data(), b.data(), s.size(), DType::i32, ReduceOp::sum);
    CHECK(s == std::vector<int32_t>{3, -4, -1, std::numeric_limits<int32_t>::min()});
    auto m = a;
    mc::reduce_into(m.data(), b.data(), m.size(), DType::i32, ReduceOp::max);
    CHECK(m == std::vector<int32_t>{2, 3, 100000, std::numeric_limits<int32_t>::max()});
    auto v = a;
    mc::reduce_into(v.data(), b.data(), v.size(), DType::i32, ReduceOp::avg);
    CHECK(v == s);
  }
  SECTION("i64 beyond 32 bits") {
    int64_t x = int64_t{1} << 40, y = 5;
    mc::reduce_into(&x, &y, 1, DType::i64, ReduceOp::sum);
    CHECK(x == (int64_t{1} << 40) + 5);
    mc::reduce_into(&x, &y, 1, DType::i64, ReduceOp::max);
    CHECK(x == (int64_t{1} << 40) + 5);
  }
  SECTION("zero elements touch nothing, null buffers allowed") {
    mc::reduce_into(nullptr, nullptr, 0, DType::f16, ReduceOp::sum);
    float x = 1.0f;
    CHECK_THROWS_AS(mc::reduce_into(&x, nullptr, 1, DType::f32, ReduceOp::sum), mix::Error);
  }
}

TEST_CASE("reduce_into f16 adds in FP32 and rounds every hop", "[collective][f16]") {
  SECTION("exact sums stay exact") {
    CHECK(f16_hop(1.5f, 2.25f, ReduceOp::sum) == 3.75f);
    CHECK(f16_hop(-3.0f, 1.0f, ReduceOp::sum) == -2.0f);
    CHECK(f16_hop(2048.0f, 2.0f, ReduceOp::sum) == 2050.0f);
  }
  SECTION("a tie rounds to even: 2048 + 1 stays 2048, 2048 + 3 becomes 2052") {
    CHECK(f16_hop(2048.0f, 1.0f, ReduceOp::sum) == 2048.0f);
    CHECK(f16_hop(2050.0f, 1.0f, ReduceOp::sum) == 2052.0f);  // 2051 is a tie; 2052 is the even neighbour
    CHECK(f16_hop(2048.0f, 3.0f, ReduceOp::sum) == 2052.0f);
    CHECK(f16_hop(1.0f, 0.00048828125f, ReduceOp::sum) == 1.0f);  // 1 + 2^-11: a tie at spacing 2^-10
  }
  SECTION("per-hop rounding makes the order matter") {
    // Folding 2048, 1, 1, 1, 1 left to right loses every 1 (each hop is a tie
    // down to 2048); adding the ones first keeps them (2048 + 4 is exact).
    float left = 2048.0f;
    for (int i = 0; i < 4; ++i) left = f16_hop(left, 1.0f, ReduceOp::sum);
    CHECK(left == 2048.0f);
    const float ones = f16_hop(f16_hop(1.0f, 1.0f, ReduceOp::sum), f16_hop(1.0f, 1.0f, ReduceOp::sum), ReduceOp::sum);
    CHECK(f16_hop(2048.0f, ones, ReduceOp::sum) == 2052.0f);
    // A third order, (2048 + 1) + (1 + 1): 2048 + 2 = 2050. Three trees, three answers.
    CHECK(f16_hop(f16_hop(2048.0f, 1.0f, ReduceOp::sum), f16_hop(1.0f, 1.0f, ReduceOp::sum), ReduceOp::sum) ==
          2050.0f);
  }
  SECTION("overflow to inf at 65520, like a GPU store") {
    CHECK(f16_hop(65504.0f, 8.0f, ReduceOp::sum) == 65504.0f);  // 65512 rounds down
    CHECK(std::isinf(f16_hop(65504.0f, 16.0f, ReduceOp::sum)));  // 65520: tie, rounds to the even "65536" = inf
    CHECK(std::isinf(f16_hop(65504.0f, 65504.0f, ReduceOp::sum)));
    CHECK(f16_hop(-65504.0f, -65504.0f, ReduceOp::sum) == -std::numeric_limits<float>::infinity());
  }
  SECTION("subnormals are kept") {
    const float tiny = std::ldexp(1.0f, -24);  // smallest positive f16
    CHECK(f16_hop(tiny, tiny, ReduceOp::sum) == std::ldexp(1.0f, -23));
    CHECK(f16_hop(tiny, -tiny, ReduceOp::sum) == 0.0f);
  }
  SECTION("inf and NaN propagate") {
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(std::isnan(f16_hop(inf, -inf, ReduceOp::sum)));
    CHECK(std::isnan(f16_hop(nan, 1.0f, ReduceOp::sum)));
    CHECK(std::isnan(f16_hop(1.0f, nan, ReduceOp::max)));
    CHECK(std::isnan(f16_hop(nan, 1.0f, ReduceOp::max)));
    CHECK(f16_hop(inf, 1.0f, ReduceOp::max) == inf);
  }
  SECTION("max picks the larger input unchanged") {
    CHECK(f16_hop(-3.0f, -2.5f, ReduceOp::max) == -2.5f);
    CHECK(f16_hop(2048.0f, 2046.0f, ReduceOp::max) == 2048.0f);
    uint16_t x = 0x8000;  // -0
    const uint16_t y = 0x0000;
    mc::reduce_into(&x, &y, 1, DType::f16, ReduceOp::max);
    CHECK(x == 0x0000);
  }
  SECTION("avg combines like sum") {
    CHECK(f16_hop(2048.0f, 1.0f, ReduceOp::avg) == 2048.0f);
    CHECK(f16_hop(1.5f, 2.25f, ReduceOp::avg) == 3.75f);
  }
  SECTION("long buffers: every element on its own (crosses the internal blocks)") {
    const size_t n = 1000;
    std::vector<uint16_t> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = h(2048.0f);
      b[i] = h(static_cast<float>(i % 4));  // 2048 + {0,1,2,3} -> {2048, 2048, 2050, 2052}
    }
    mc::reduce_into(a.data(), b.data(), n, DType::f16, ReduceOp::sum);
    const float expected[4] = {2048.0f, 2048.0f, 2050.0f, 2052.0f};
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += hf(a[i]) != expected[i % 4];
    CHECK(wrong == 0);
  }
}

TEST_CASE("reduce_into bf16 adds in FP32 and rounds every hop", "[collective][bf16]") {
  CHECK(bf16_hop(1.5f, 2.25f, ReduceOp::sum) == 3.75f);
  CHECK(bf16_hop(256.0f, 1.0f, ReduceOp::sum) == 256.0f);  // tie at spacing 2 -> even
  CHECK(bf16_hop(258.0f, 1.0f, ReduceOp::sum) == 260.0f);  // 259: tie, 260 is even
  CHECK(bf16_hop(256.0f, 2.0f, ReduceOp::sum) == 258.0f);
  CHECK(bf16_hop(1.0f, 0.00390625f, ReduceOp::sum) == 1.0f);  // 1 + 2^-8: tie at spacing 2^-7
  CHECK(bf16_hop(-4.0f, 3.0f, ReduceOp::max) == 3.0f);
  CHECK(bf16_hop(256.0f, 1.0f, ReduceOp::avg) == 256.0f);
  // bf16 has FP32's range: it overflows only past 3.39e38.
  CHECK(bf16_hop(1e38f, 1e38f, ReduceOp::sum) == 2.0f * bff(bf(1e38f)));
  CHECK(std::isinf(bf16_hop(3e38f, 3e38f, ReduceOp::sum)));
  CHECK(std::isnan(bf16_hop(std::numeric_limits<float>::quiet_NaN(), 1.0f, ReduceOp::max)));
  CHECK(std::isnan(bf16_hop(1.0f, std::numeric_limits<float>::quiet_NaN(), ReduceOp::max)));
}

TEST_CASE("local communicator: world of one", "[collective][local]") {
  auto comm = mc::make_local_communicator();
  CHECK(comm->rank() == 0);
  CHECK(comm->world_size() == 1);
  CHECK(comm->local_rank() == 0);
  CHECK(comm->local_size() == 1);
  CHECK(comm->backend_name() == "local");
  comm->barrier();
}

TEST_CASE("local all_reduce is the identity for every dtype and op", "[collective][local]") {
  auto comm = mc::make_local_communicator();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
    INFO("op " << mc::reduce_op_name(op));
    std::vector<float> f32 = {1.5f, -2.0f, 3e38f, std::numeric_limits<float>::quiet_NaN()};
    const auto f32_before = f32;
    comm->all_reduce(f32.data(), f32.size(), DType::f32, op);
    CHECK(std::memcmp(f32.data(), f32_before.data(), f32.size() * 4) == 0);

    // 2049 is not an f16 value but its bits pass untouched; so do NaN payloads.
    std::vector<uint16_t> f16 = {h(2048.0f), h(0.1f), 0x7e01, 0x0001, 0x8000};
    const auto f16_before = f16;
    comm->all_reduce(f16.data(), f16.size(), DType::f16, op);
    CHECK(f16 == f16_before);

    std::vector<uint16_t> b16 = {bf(256.0f), bf(-0.3f), 0x7fc1};
    const auto b16_before = b16;
    comm->all_reduce(b16.data(), b16.size(), DType::bf16, op);
    CHECK(b16 == b16_before);

    std::vector<int32_t> i32 = {7, -3, std::numeric_limits<int32_t>::min()};
    const auto i32_before = i32;
    comm->all_reduce(i32.data(), i32.size(), DType::i32, op);
    CHECK(i32 == i32_before);
  }
  comm->all_reduce(nullptr, 0, DType::f32, ReduceOp::sum);
  CHECK_THROWS_AS(comm->all_reduce(nullptr, 3, DType::f32, ReduceOp::sum), mix::Error);
}

TEST_CASE("local broadcast and all_gather", "[collective][local]") {
  auto comm = mc::make_local_communicator();
  std::vector<char> buf = {'a', 'b', 'c'};
  comm->broadcast(buf.data(), buf.size(), 0);
  CHECK(buf == std::vector<char>{'a', 'b', 'c'});
  CHECK_THROWS_AS(comm->broadcast(buf.data(), buf.size(), 1), mix::Error);

  const std::vector<int32_t> send = {1, 2, 3};
  std::vector<int32_t> recv(3, -1);
  comm->all_gather(send.data(), recv.data(), send.size() * 4);
  CHECK(recv == send);
  // In place: the send buffer is this rank's slot of the receive buffer.
  comm->all_gather(recv.data(), recv.data(), recv.size() * 4);
  CHECK(recv == send);
}

TEST_CASE("local byte counters split gradient and control traffic", "[collective][local]") {
  auto comm = mc::make_local_communicator();
  CHECK(comm->bytes().grad_allreduce_bytes == 0);
  CHECK(comm->bytes().other_bytes == 0);
  CHECK(comm->bytes().grad_allreduce_calls == 0);

  std::vector<uint16_t> grads(1000);
  comm->all_reduce(grads.data(), grads.size(), DType::f16, ReduceOp::sum, Traffic::gradients);
  std::vector<float> grads32(10);
  comm->all_reduce(grads32.data(), grads32.size(), DType::f32, ReduceOp::avg, Traffic::gradients);
  CHECK(comm->bytes().grad_allreduce_bytes == 2000 + 40);
  CHECK(comm->bytes().grad_allreduce_calls == 2);
  CHECK(comm->bytes().other_bytes == 0);

  int32_t found_inf = 0;
  comm->all_reduce(&found_inf, 1, DType::i32, ReduceOp::max);  // control is the default
  CHECK(comm->bytes().other_bytes == 4);
  char blob[100] = {};
  comm->broadcast(blob, sizeof(blob), 0);
  CHECK(comm->bytes().other_bytes == 104);
  uint64_t fp = 42, all = 0;
  comm->all_gather(&fp, &all, 8);
  CHECK(comm->bytes().other_bytes == 112);
  comm->barrier();
  CHECK(comm->bytes().other_bytes == 112);
  CHECK(comm->bytes().grad_allreduce_bytes == 2040);
  CHECK(comm->bytes().grad_allreduce_calls == 2);

  comm->reset_bytes();
  CHECK(comm->bytes().grad_allreduce_bytes == 0);
  CHECK(comm->bytes().other_bytes == 0);
  CHECK(comm->bytes().grad_allreduce_calls == 0);
}

TEST_CASE("local abort ends the process with the code", "[collective][local]") {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto comm = mc::make_local_communicator();
    comm->abort(7);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 7);
}

TEST_CASE("launched_under_mpi reads the launchers' variables", "[collective]") {
  std::vector<std::unique_ptr<EnvGuard>> cleared;
  for (const char* name : kLauncherVars) cleared.push_back(std::make_unique<EnvGuard>(name, nullptr));
  CHECK_FALSE(mc::launched_under_mpi());
  {
    // Not under a launcher: the default is the local backend.
    auto comm = mc::make_default_communicator();
    CHECK(comm->backend_name() == "local");
    CHECK(comm->world_size() == 1);
  }
  for (const char* name : kLauncherVars) {
    INFO(name);
    EnvGuard set(name, "2");
    CHECK(mc::launched_under_mpi());
  }
  {
    EnvGuard empty("PMI_RANK", "");
    CHECK_FALSE(mc::launched_under_mpi());
  }
}
