// The AMP step's two cross-rank reductions as ops, run through the MPI
// communicator on 2 and 4 ranks, each rank building its own inputs:
//   - c_allreduce_found_inf (collective/found_inf_allreduce_op.cc): the global
//     overflow flag and the provenance mask of ranks and parameters;
//   - the gradient all-reduce that insert_grad_allreduce builds
//     (collective/grad_allreduce_pass.cc) with --grad-predivide F: 1/F before
//     the sum, F/world after it.
// Expected values are worked out by hand per world size (masks as literal
// words, sums of FP16 values chosen so that every hop is exact or its
// rounding is known), never from the code under test.
#include "tests/mpi/mpi_test_main.h"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/grad_allreduce_pass.h"
#include "runtime/core/half.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "tests/temp_var.h"

using namespace mix;
using mix::test::temp_var;

static collective::Communicator* g_comm = nullptr;

namespace {

Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::i32);
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}

std::vector<int32_t> i32_values(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

// Identical on every rank, as the step's skip decision must be.
bool same_on_all_ranks(const std::vector<int32_t>& v) {
  const size_t world = static_cast<size_t>(g_comm->world_size());
  std::vector<int32_t> all(v.size() * world);
  g_comm->all_gather(v.data(), all.data(), v.size() * sizeof(int32_t));
  for (size_t r = 0; r < world; ++r)
    for (size_t i = 0; i < v.size(); ++i)
      if (all[r * v.size() + i] != v[i]) return false;
  return true;
}

}  // namespace

TEST_CASE("c_allreduce_found_inf across ranks: every rank gets the flag and the same mask", "[found_inf]") {
  const int world = g_comm->world_size(), rank = g_comm->rank();
  if (world != 2 && world != 4) {
    mix::testing::skip_part("found_inf masks are worked out for 2 and 4 ranks, not " + std::to_string(world));
    return;
  }
  // Two buckets of gradients: bucket 0 holds fc2.bias, fc2.weight; bucket 1
  // fc1.bias, fc1.weight, bn.weight. Mask rows: 0 = ranks that overflowed,
  // 1 + j = ranks where parameter j (in this order) did.
  const std::vector<std::string> params{"fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight", "bn.weight"};
  auto program = [&](int64_t room) {
    Program p;
    p.add_var(temp_var("found_inf.bucket0", {1}, DType::i32));
    p.add_var(temp_var("found_inf.bucket0.each", {2}, DType::i32));
    p.add_var(temp_var("found_inf.bucket1", {1}, DType::i32));
    p.add_var(temp_var("found_inf.bucket1.each", {3}, DType::i32));
    p.append_op(make_op("c_allreduce_found_inf",
                        {{"FoundInfinite", {"found_inf.bucket0", "found_inf.bucket1"}},
                         {"FoundInfiniteEach", {"found_inf.bucket0.each", "found_inf.bucket1.each"}}},
                        {{"Out", {"found_inf"}}, {"OverflowRanks", {"found_inf.ranks"}}},
                        {{"params", params}, {"world_size", room}}));
    return p;
  };
  // What rank r marks: the parameters (0..4) whose gradient held an inf or
  // NaN, and a bucket flag raised with no parameter named (a bad scale).
  struct Case {
    const char* what;
    std::map<int, std::set<int>> params_of_rank;
    std::set<int> bare_flag_ranks;
    int32_t want_found;
    std::vector<int32_t> want_np2, want_np4;  // rows 0..5, one word each
  };
  const int last = world - 1;
  const Case cases[] = {
      {"no rank overflows", {}, {}, 0, {0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0}},
      {"only rank 1 overflows, in fc1.weight", {{1, {3}}}, {}, 1, {2, 0, 0, 0, 2, 0}, {2, 0, 0, 0, 2, 0}},
      {"rank 0 in fc2.bias, the last rank in fc2.bias and bn.weight",
       {{0, {0}}, {last, {0, 4}}},
       {},
       1,
       {3, 3, 0, 0, 0, 2},
       {9, 9, 0, 0, 0, 8}},
      {"every rank r in parameter r",
       {{0, {0}}, {1, {1}}, {2, {2}}, {3, {3}}},
       {},
       1,
       {3, 1, 2, 0, 0, 0},
       {15, 1, 2, 4, 8, 0}},
      {"the last rank raises a flag naming no gradient", {}, {last}, 1, {2, 0, 0, 0, 0, 0}, {8, 0, 0, 0, 0, 0}},
  };
  auto comm_env = [&] {
    ExecEnv env;
    env.comm = g_comm;
    return env;
  };
  for (const Case& c : cases) {
    // This rank's inputs.
    std::vector<int32_t> each0(2, 0), each1(3, 0);
    int32_t flag0 = 0, flag1 = 0;
    if (auto it = c.params_of_rank.find(rank); it != c.params_of_rank.end()) {
      for (int j : it->second) {
        if (j < 2) {
          each0[static_cast<size_t>(j)] = 1;
          flag0 = 1;
        } else {
          each1[static_cast<size_t>(j - 2)] = 1;
          flag1 = 1;
        }
      }
    }
    if (c.bare_flag_ranks.count(rank)) flag1 = 1;
    const std::vector<int32_t>& want = world == 2 ? c.want_np2 : c.want_np4;
    // The mask sized for the world, and for 40 ranks: two words per row, the
    // second always 0 here.
    for (int64_t room : {int64_t{world}, int64_t{40}}) {
      const Program p = program(room);
      Scope scope;
      scope.set("found_inf.bucket0", i32_tensor({flag0}));
      scope.set("found_inf.bucket1", i32_tensor({flag1}));
      scope.set("found_inf.bucket0.each", i32_tensor(each0));
      scope.set("found_inf.bucket1.each", i32_tensor(each1));
      ExecEnv env = comm_env();
      Executor(p, {"found_inf", "found_inf.ranks"}).run(scope, env);
      std::vector<int32_t> want_words;
      for (int32_t w : want) {
        want_words.push_back(w);
        if (room == 40) want_words.push_back(0);
      }
      const std::vector<int32_t> got = i32_values(scope.get("found_inf.ranks"));
      INFO(c.what << ", room for " << room << " ranks, on " << world << " ranks, rank " << rank);
      CHECK(scope.get("found_inf").data<int32_t>()[0] == c.want_found);
      CHECK(scope.get("found_inf.ranks").shape() == Shape{6, room == 40 ? 2 : 1});
      CHECK(got == want_words);
      CHECK(same_on_all_ranks(got));
    }
  }
}

namespace {

// FP16 binary16 bit patterns used below, worked out by hand.
constexpr uint16_t kF16_40000 = 0x78e2;     // 40000 = 1.220703125 * 2^15: spacing 32, 1250 * 32
constexpr uint16_t kF16_Inf = 0x7c00;
constexpr uint16_t kF16_Tiniest = 0x0001;   // 2^-24, the smallest subnormal
constexpr uint16_t kF16_Minus8 = 0xc800;
constexpr uint16_t kF16_Ramp[] = {0x6400, 0x6800, 0x6a00, 0x6c00};  // 1024 (r + 1): 1024, 2048, 3072, 4096
constexpr uint16_t kF16_1536 = 0x6600;  // 1.5 * 2^10
constexpr uint16_t kF16_2560 = 0x6900;  // 1.25 * 2^11

}  // namespace

TEST_CASE("--grad-predivide across ranks: 1/F before the sum, F/world after, FP16 as it rounds", "[predivide]") {
  const int world = g_comm->world_size(), rank = g_comm->rank();
  if (world != 2 && world != 4) {
    mix::testing::skip_part("predivide sums are worked out for 2 and 4 ranks, not " + std::to_string(world));
    return;
  }
  const auto w = static_cast<double>(world);
  // Closed forms, for W ranks (every value below is exact in FP16 unless said):
  //   40000 on every rank: the average is 40000. With F = W or 2W each rank
  //     sends 40000/F (20000, 10000 or 5000: exact) and every partial sum is
  //     at most 40000; with F = 1 the first hop already gives 80000, past
  //     FP16's 65504: inf, which the F/W after the sum cannot undo.
  //   1024 (r + 1): the average is 512 (W + 1) for every F; every partial sum
  //     is a multiple of 1024/F below 2^14, so exact.
  //   2^-24 on every rank: with F = 1 the sum W * 2^-24 is exact and times 1/W
  //     gives 2^-24 back; with F >= 2 the predivided 2^-25 or 2^-26 rounds to 0
  //     (2^-25 is a tie between 0 and 2^-24: to the even 0).
  //   -8 everywhere: -8 for every F.
  struct Run {
    double predivide;
    const char* what;
    uint16_t big, tiniest;
  };
  const Run runs[] = {
      {0, "F = world (the default)", kF16_40000, 0},
      {w, "F = world", kF16_40000, 0},
      {1, "F = 1 (all the division after the sum)", kF16_Inf, kF16_Tiniest},
      {2 * w, "F = 2 world (postscale 2)", kF16_40000, 0},
  };
  const uint16_t avg_ramp = world == 2 ? kF16_1536 : kF16_2560;  // 512 (W + 1)
  for (const Run& run : runs) {
    Program p;
    p.add_var(temp_var("a@GRAD", {3}, DType::f16));
    p.add_var(temp_var("b@GRAD", {2}, DType::f16));
    collective::GradSyncOptions o;
    o.world_size = world;
    o.predivide = run.predivide;
    o.overlap = false;  // no backward ops here to overlap with
    std::vector<collective::GradBucket> buckets;
    collective::insert_grad_allreduce(p, {{"a", "a@GRAD"}, {"b", "b@GRAD"}}, collective::GradReduce::fp16, o,
                                      &buckets);
    REQUIRE(buckets.size() == 1);  // one packed bucket: the pack/unpack path

    Scope scope;
    auto f16 = [](std::vector<uint16_t> bits) {
      Tensor t = Tensor::empty({static_cast<int64_t>(bits.size())}, DType::f16);
      for (size_t i = 0; i < bits.size(); ++i) t.data<uint16_t>()[i] = bits[i];
      return t;
    };
    // This rank's gradients of two parameters (one packed bucket).
    scope.set("a@GRAD", f16({kF16_40000, kF16_Ramp[rank], kF16_Tiniest}));
    scope.set("b@GRAD", f16({kF16_Minus8, kF16_40000}));
    ExecEnv env;
    env.comm = g_comm;
    Executor(p, {"a@GRAD", "b@GRAD"}).run(scope, env);

    const uint16_t* a = scope.get("a@GRAD").data<uint16_t>();
    const uint16_t* b = scope.get("b@GRAD").data<uint16_t>();
    INFO(run.what << " on " << world << " ranks, rank " << rank << ": a = [" << half_bits_to_float(a[0]) << ", "
                  << half_bits_to_float(a[1]) << ", " << half_bits_to_float(a[2]) << "], b = ["
                  << half_bits_to_float(b[0]) << ", " << half_bits_to_float(b[1]) << "]");
    CHECK(a[0] == run.big);
    CHECK(a[1] == avg_ramp);
    CHECK(a[2] == run.tiniest);
    CHECK(b[0] == kF16_Minus8);
    CHECK(b[1] == run.big);
    CHECK(same_on_all_ranks({a[0], a[1], a[2], b[0], b[1]}));
  }
}

int main(int argc, char** argv) { return mix::testing::run_mpi_tests(argc, argv, "test_grad_sync_ranks", g_comm); }
