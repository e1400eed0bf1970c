// The ops of the overlapped gradient sync, on the single-process communicator:
// c_allreduce_start / c_allreduce_wait (collective/allreduce_op.cc) and
// c_allreduce_found_inf with its provenance mask (collective/found_inf_allreduce_op.cc,
// collective/overflow_mask.h). Multi-rank behaviour: mpi.test_collectives
// (started all-reduces) and e2e.test_overlap (training, provenance).
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/overflow_mask.h"
#include "runtime/core/check.h"
#include "runtime/core/half.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "tests/temp_var.h"

using namespace mix;
using mix::test::temp_var;
using Catch::Contains;

namespace {

std::vector<int32_t> i32_values(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

// A bucket of FP16 gradients, started and waited for with pre/post scaling.
struct Bucket {
  Program p;
  Scope scope;
  ExecEnv env;
  std::unique_ptr<collective::Communicator> comm = collective::make_local_communicator();
  std::vector<std::string> grads;

  Bucket(const std::vector<Shape>& shapes, double prescale, double postscale, bool with_wait = true) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      std::string name = "g";  // appended, not "g" + ...: GCC 12 warns falsely (-Wrestrict) on that form
      name += std::to_string(i);
      name += kGradSuffix;
      grads.push_back(name);
      p.add_var(temp_var(grads.back(), shapes[i], DType::f16));
    }
    p.append_op(make_op("c_allreduce_start", {{"X", grads}}, {{"Buffer", {"grad_bucket.0"}}},
                        {{"prescale", prescale}, {"traffic", std::string("gradients")}, {"bucket", int64_t{0}}}));
    if (with_wait)
      p.append_op(make_op("c_allreduce_wait", {{"Buffer", {"grad_bucket.0"}}}, {{"Out", grads}},
                          {{"postscale", postscale}, {"traffic", std::string("gradients")}, {"bucket", int64_t{0}}}));
    env.comm = comm.get();
  }
  void feed(const std::vector<std::vector<float>>& values) {
    for (size_t i = 0; i < grads.size(); ++i) {
      Tensor t = Tensor::empty(p.var(grads[i]).shape, DType::f16);
      REQUIRE(static_cast<size_t>(t.numel()) == values[i].size());
      for (size_t k = 0; k < values[i].size(); ++k) t.data<uint16_t>()[k] = float_to_half_bits(values[i][k]);
      scope.set(grads[i], t);
    }
  }
  void run() { Executor(p, std::set<std::string>(grads.begin(), grads.end())).run(scope, env); }
  std::vector<float> out(size_t i) const { return scope.get(grads[i]).to_floats(); }
};

}  // namespace

TEST_CASE("c_allreduce_start declares the packed bucket", "[collective][overlap]") {
  Bucket b({{2, 3}, {4}, {1}}, 0.5, 2.0);
  CHECK(b.p.var("grad_bucket.0").dtype == DType::f16);
  CHECK(b.p.var("grad_bucket.0").shape == Shape{11});
  Program mixed;
  mixed.add_var(temp_var("a", {2}, DType::f16));
  mixed.add_var(temp_var("b", {2}, DType::f32));
  CHECK_THROWS_WITH(mixed.append_op(make_op("c_allreduce_start", {{"X", {"a", "b"}}}, {{"Buffer", {"buf"}}})),
                    Contains("mixes dtypes") && Contains("b is f32"));
}

TEST_CASE("start then wait: pack, prescale, reduce, postscale, unpack (world 1)", "[collective][overlap]") {
  // World 1: the sum is the identity, so the result is x * prescale * postscale,
  // each product rounded to FP16 as the GPU kernel rounds it.
  Bucket b({{2, 3}, {4}, {1}}, 0.25, 8.0);
  b.feed({{1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {-8.f, 0.5f, 0.f, 1000.f}, {3.f}});
  int progress_calls = 0;
  b.env.progress = [&] { ++progress_calls; };
  b.run();
  CHECK(b.out(0) == std::vector<float>{2.f, 4.f, 6.f, 8.f, 10.f, 12.f});
  CHECK(b.out(1) == std::vector<float>{-16.f, 1.f, 0.f, 2000.f});
  CHECK(b.out(2) == std::vector<float>{6.f});
  CHECK(b.env.in_flight.empty());
  CHECK(b.comm->in_flight() == 0);
  CHECK(progress_calls == 1);  // after the start, while the bucket was in flight; not after the wait
  CHECK(b.comm->bytes().grad_allreduce_bytes == 11 * 2);
  CHECK(!b.scope.has("grad_bucket.0"));  // the packed buffer is released after its wait

  // FP16 rounding after each scale: a prescale of 2^-25 pushes 3 into FP16's
  // subnormals, where 1.5 * 2^-24 rounds (ties to even) to 2^-23 and comes back
  // as 4; 1024 * 2^-25 = 2^-15 is a subnormal that holds it exactly.
  Bucket r({{2}}, 0x1p-25, 0x1p25);
  r.feed({{3.f, 1024.f}});
  r.run();
  CHECK(r.out(0) == std::vector<float>{4.f, 1024.f});
  Bucket u({{2}}, 0.5, 2.0);
  u.feed({{3.f, 0x1p-24f}});
  u.run();
  CHECK(u.out(0) == std::vector<float>{3.f, 0.f});
}

TEST_CASE("a one-gradient bucket is reduced where it lies", "[collective][overlap]") {
  Bucket b({{3}}, 0.5, 4.0, /*with_wait=*/false);
  b.feed({{2.f, 4.f, 6.f}});
  const Tensor before = b.scope.get(b.grads[0]);
  ExecEnv& env = b.env;
  Executor start_only(b.p, {b.grads[0], "grad_bucket.0"});
  // The executor refuses to end a run with the all-reduce still in flight.
  CHECK_THROWS_WITH(start_only.run(b.scope, env), Contains("never waited for") && Contains("grad_bucket.0"));
  CHECK(b.scope.get("grad_bucket.0").shares_storage(before));  // a view, not a copy
  CHECK(b.scope.get(b.grads[0]).to_floats() == std::vector<float>{1.f, 2.f, 3.f});  // prescaled in place
}

TEST_CASE("a wait with no start in flight is an error that names the bucket", "[collective][overlap]") {
  Program p;
  p.add_var(temp_var("g@GRAD", {2}, DType::f32));
  p.add_var(temp_var("grad_bucket.3", {2}, DType::f32));
  p.append_op(make_op("c_allreduce_wait", {{"Buffer", {"grad_bucket.3"}}}, {{"Out", {"g@GRAD"}}}));
  Scope scope;
  scope.set("g@GRAD", Tensor::from_floats({2}, {1.f, 2.f}));
  scope.set("grad_bucket.3", Tensor::from_floats({2}, {1.f, 2.f}));
  auto comm = collective::make_local_communicator();
  ExecEnv env;
  env.comm = comm.get();
  CHECK_THROWS_WITH(Executor(p, {"g@GRAD"}).run(scope, env),
                    Contains("no all-reduce of grad_bucket.3 is in flight"));
  CHECK_THROWS_WITH(comm->wait(12345), Contains("no such request"));
}

TEST_CASE("c_allreduce_sum / c_allreduce_max in one op (world 1): scaled floats, integers copied", "[collective]") {
  auto comm = collective::make_local_communicator();
  auto run = [&](const std::string& type, const std::vector<Tensor>& xs, std::map<std::string, Attr> attrs) {
    Program p;
    Scope scope;
    std::vector<std::string> names;
    for (size_t i = 0; i < xs.size(); ++i) {
      std::string name = "x";
      name += std::to_string(i);
      names.push_back(name);
      p.add_var(temp_var(name, xs[i].shape(), xs[i].dtype()));
      scope.set(name, xs[i].clone());
    }
    p.append_op(make_op(type, {{"X", names}}, {{"Out", names}}, std::move(attrs)));
    ExecEnv env;
    env.comm = comm.get();
    Executor(p, std::set<std::string>(names.begin(), names.end())).run(scope, env);
    std::vector<std::vector<float>> out;
    for (auto& n : names) out.push_back(scope.get(n).to_floats());
    return out;
  };
  // Packed (two tensors) and in place (one): x * 0.25 * 3.
  const auto sum = run("c_allreduce_sum", {Tensor::from_floats({3}, {4.f, -8.f, 1.f}), Tensor::from_floats({1}, {2.f})},
                       {{"prescale", 0.25}, {"postscale", 3.0}});
  CHECK(sum == std::vector<std::vector<float>>{{3.f, -6.f, 0.75f}, {1.5f}});
  CHECK(run("c_allreduce_sum", {Tensor::from_floats({2}, {4.f, 6.f})}, {{"prescale", 0.5}}) ==
        std::vector<std::vector<float>>{{2.f, 3.f}});
  CHECK(run("c_allreduce_sum", {Tensor::from_floats({2}, {4.f, 6.f})}, {{"prescale", 0.5}, {"postscale", 3.0}}) ==
        std::vector<std::vector<float>>{{6.f, 9.f}});
  // FP16, packed and in place: prescale first, rounded to FP16, then postscale. 3 * 2^-25
  // rounds (ties to even) to 2^-23 and comes back as 4; the other order overflows to inf.
  auto half = [](std::vector<float> values) {
    Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::f16);
    for (size_t k = 0; k < values.size(); ++k) t.data<uint16_t>()[k] = float_to_half_bits(values[k]);
    return t;
  };
  const std::map<std::string, Attr> tiny_then_back = {{"prescale", 0x1p-25}, {"postscale", 0x1p25}};
  CHECK(run("c_allreduce_sum", {half({3.f, 1024.f}), half({3.f})}, tiny_then_back) ==
        std::vector<std::vector<float>>{{4.f, 1024.f}, {4.f}});
  CHECK(run("c_allreduce_sum", {half({3.f, 1024.f})}, tiny_then_back) ==
        std::vector<std::vector<float>>{{4.f, 1024.f}});
  CHECK_THROWS_WITH(run("c_allreduce_max", {Tensor::from_floats({1}, {1.f})}, {{"prescale", 0.5}}),
                    Contains("only sums take pre/post scaling"));
}

TEST_CASE("c_allreduce_sum / c_allreduce_max of integer buckets copy every bit (world 1)", "[collective]") {
  // Values past 2^24 (float's integers) and past 2^32: a detour through float
  // or a narrower type would change them.
  const int64_t big = (int64_t{1} << 40) + 3;
  for (const char* type : {"c_allreduce_sum", "c_allreduce_max"})
    for (DType dtype : {DType::i32, DType::i64}) {
      INFO(type << " " << dtype_name(dtype));
      auto comm = collective::make_local_communicator();
      Program p;
      Scope scope;
      const std::vector<std::string> names = {"i0", "i1"};
      const std::vector<std::vector<int64_t>> values = {{7, -2, (1 << 24) + 1}, {dtype == DType::i64 ? big : -5}};
      for (size_t k = 0; k < names.size(); ++k) {
        Tensor t = Tensor::empty({static_cast<int64_t>(values[k].size())}, dtype);
        for (size_t i = 0; i < values[k].size(); ++i)
          if (dtype == DType::i32)
            t.data<int32_t>()[i] = static_cast<int32_t>(values[k][i]);
          else
            t.data<int64_t>()[i] = values[k][i];
        p.add_var(temp_var(names[k], t.shape(), dtype));
        scope.set(names[k], t);
      }
      p.append_op(make_op(type, {{"X", names}}, {{"Out", names}}));
      ExecEnv env;
      env.comm = comm.get();
      Executor(p, {"i0", "i1"}).run(scope, env);
      for (size_t k = 0; k < names.size(); ++k) {
        const Tensor& t = scope.get(names[k]);
        std::vector<int64_t> got;
        for (int64_t i = 0; i < t.numel(); ++i)
          got.push_back(dtype == DType::i32 ? t.data<int32_t>()[i] : t.data<int64_t>()[i]);
        CHECK(got == values[k]);
      }
      CHECK(comm->bytes().grad_allreduce_bytes == 0);  // no traffic attribute: counted as control
    }
}

TEST_CASE("overflow mask: one bit per rank, rows OR by summing", "[collective][provenance]") {
  CHECK(collective::overflow_mask_words(1) == 1);
  CHECK(collective::overflow_mask_words(32) == 1);
  CHECK(collective::overflow_mask_words(33) == 2);
  // Three ranks' masks of 64 ranks (2 words): 0, 31 and 63 (the sign bits of both words).
  std::vector<int32_t> sum(2, 0);
  for (int rank : {0, 31, 63}) {
    std::vector<int32_t> mine(2, 0);
    collective::mark_rank(mine.data(), rank);
    for (int r = 0; r < 64; ++r) CHECK(collective::has_rank(mine.data(), r) == (r == rank));
    collective::reduce_into(sum.data(), mine.data(), 2, DType::i32, collective::ReduceOp::sum);
  }
  for (int r = 0; r < 64; ++r) CHECK(collective::has_rank(sum.data(), r) == (r == 0 || r == 31 || r == 63));
  CHECK(collective::any_rank(sum.data(), 2));
  // Only a rank in the second word: any_rank reads every word.
  std::vector<int32_t> high(2, 0);
  collective::mark_rank(high.data(), 63);
  CHECK(collective::any_rank(high.data(), 2));
  const int32_t zero[2] = {0, 0};
  CHECK_FALSE(collective::any_rank(zero, 2));
}

TEST_CASE("c_allreduce_found_inf: the global flag and which parameters overflowed (world 1)",
          "[collective][provenance]") {
  Program p;
  p.add_var(temp_var("found_inf.bucket0", {1}, DType::i32));
  p.add_var(temp_var("found_inf.bucket0.each", {2}, DType::i32));
  p.add_var(temp_var("found_inf.bucket1", {1}, DType::i32));
  p.add_var(temp_var("found_inf.bucket1.each", {3}, DType::i32));
  const std::vector<std::string> params{"fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight", "bn.weight"};
  p.append_op(make_op("c_allreduce_found_inf",
                      {{"FoundInfinite", {"found_inf.bucket0", "found_inf.bucket1"}},
                       {"FoundInfiniteEach", {"found_inf.bucket0.each", "found_inf.bucket1.each"}}},
                      {{"Out", {"found_inf"}}, {"OverflowRanks", {"found_inf.ranks"}}},
                      {{"params", params}, {"world_size", int64_t{1}}}));
  CHECK(p.var("found_inf.ranks").shape == Shape{6, 1});
  auto comm = collective::make_local_communicator();
  ExecEnv env;
  env.comm = comm.get();
  auto flags = [](std::vector<int32_t> v) {
    Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::i32);
    for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
    return t;
  };
  struct Case {
    int32_t b0, b1;
    std::vector<int32_t> e0, e1;
    int32_t want_found;
    std::vector<int32_t> want_mask;
  };
  const Case cases[] = {
      {0, 0, {0, 0}, {0, 0, 0}, 0, {0, 0, 0, 0, 0, 0}},
      {0, 1, {0, 0}, {0, 1, 0}, 1, {1, 0, 0, 0, 1, 0}},  // fc1.weight
      {1, 1, {1, 0}, {1, 0, 1}, 1, {1, 1, 0, 1, 0, 1}},  // fc2.bias, fc1.bias, bn.weight
      {1, 0, {0, 0}, {0, 0, 0}, 1, {1, 0, 0, 0, 0, 0}},  // a flag with no gradient named (a bad scale on a GPU)
  };
  for (const Case& c : cases) {
    Scope scope;
    scope.set("found_inf.bucket0", flags({c.b0}));
    scope.set("found_inf.bucket1", flags({c.b1}));
    scope.set("found_inf.bucket0.each", flags(c.e0));
    scope.set("found_inf.bucket1.each", flags(c.e1));
    Executor(p, {"found_inf", "found_inf.ranks"}).run(scope, env);
    CHECK(scope.get("found_inf").data<int32_t>()[0] == c.want_found);
    CHECK(i32_values(scope.get("found_inf.ranks")) == c.want_mask);
  }
  // The parameter list must match the flags.
  Program bad = p;
  bad.ops().clear();
  CHECK_THROWS_WITH(bad.append_op(make_op("c_allreduce_found_inf",
                                          {{"FoundInfinite", {"found_inf.bucket0"}},
                                           {"FoundInfiniteEach", {"found_inf.bucket0.each"}}},
                                          {{"Out", {"found_inf"}}, {"OverflowRanks", {"found_inf.ranks"}}},
                                          {{"params", std::vector<std::string>{"a"}}})),
                    Contains("names 1 parameters but the flags hold 2"));
}
