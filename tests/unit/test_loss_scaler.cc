// Tests of the loss scaler (amp/loss_scaler.h) and the two AMP ops that carry it
// into a program: update_loss_scaling and (cast_)check_finite_and_unscale.
//
// The scaler is checked against hand-written tables of expected states, one row
// per step (or per run of steps that crosses no threshold before its last one),
// for each preset. Every table runs twice: through the host LossScaler and
// through the update_loss_scaling op in an Executor, so the op and the host
// scaler cannot drift apart. Expected scales are written as the float products
// the update computes (32768.f * 0.8f, ...), compared exactly.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "amp/loss_scaler.h"
#include "runtime/core/check.h"
#include "runtime/core/half.h"
#include "runtime/exec/executor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "tests/unit/loss_scaling_op.h"

namespace {

using Catch::Matchers::Contains;
using mix::DType;
using mix::ExecEnv;
using mix::Executor;
using mix::Program;
using mix::Scope;
using mix::Tensor;
using mix::VarDesc;
using mix::amp::LossScaler;
using mix::amp::LossScalerConfig;
using mix::amp::LossScalerState;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// `repeat` steps with the same flag; the state after the last one. A row with
// repeat > 1 must not cross a threshold before its last step (its scale stays
// that of the previous row until then, which is checked too).
struct Row {
  int repeat;
  bool found_inf;
  float scale;
  int64_t good, bad, skipped, at_min;
};

constexpr bool F = false;  // a finite step
constexpr bool T = true;   // an overflow step

// ---- the update_loss_scaling op in a one-op program ------------------------------

Tensor scalar_i64(int64_t v) {
  Tensor t = Tensor::empty({1}, DType::i64);
  t.data<int64_t>()[0] = v;
  return t;
}

VarDesc persistable(const std::string& name, DType dtype) {
  VarDesc v;
  v.name = name;
  v.shape = {1};
  v.dtype = dtype;
  v.persistable = true;
  return v;
}

// The scaler state as persistable variables, updated in place by one op.
class ScalerProgram {
 public:
  explicit ScalerProgram(const LossScalerConfig& c, DType flag_dtype = DType::i32) : flag_dtype_(flag_dtype) {
    VarDesc flag;
    flag.name = "found_inf";
    flag.shape = {1};
    flag.dtype = flag_dtype;
    program_.add_var(flag);  // a temporary: the executor releases it after the op
    program_.add_var(persistable("loss_scaling", DType::f32));
    for (const char* n : {"num_good_steps", "num_bad_steps", "num_skipped_steps", "skips_at_min"})
      program_.add_var(persistable(n, DType::i64));
    mix::OpDesc& op = program_.append_op(mix::testing::update_loss_scaling_op(
        "found_inf", {"loss_scaling", "num_good_steps", "num_bad_steps", "num_skipped_steps", "skips_at_min"},
        mix::amp::to_op_attrs(c)));
    op.role = mix::OpRole::optimize;
    executor_ = std::make_unique<Executor>(program_, std::set<std::string>{});

    const LossScalerState s = mix::amp::initial_state(c);
    scope_.set("loss_scaling", Tensor::from_floats({1}, {s.scale}));
    for (const char* n : {"num_good_steps", "num_bad_steps", "num_skipped_steps", "skips_at_min"})
      scope_.set(n, scalar_i64(0));
  }

  void feed_flag(float value) {
    Tensor t = Tensor::empty({1}, flag_dtype_);
    if (flag_dtype_ == DType::f32) {
      t.data<float>()[0] = value;
    } else {
      t.data<int32_t>()[0] = static_cast<int32_t>(value);
    }
    scope_.set("found_inf", t);
  }

  void step(bool found_inf) {
    feed_flag(found_inf ? 1.f : 0.f);
    run();
  }
  void run() { executor_->run(scope_, env_); }

  LossScalerState state() const {
    LossScalerState s;
    s.scale = scope_.get("loss_scaling").data<float>()[0];
    s.good_steps = scope_.get("num_good_steps").data<int64_t>()[0];
    s.bad_steps = scope_.get("num_bad_steps").data<int64_t>()[0];
    s.skipped_steps = scope_.get("num_skipped_steps").data<int64_t>()[0];
    s.consecutive_skips_at_min = scope_.get("skips_at_min").data<int64_t>()[0];
    return s;
  }
  const Program& program() const { return program_; }
  Scope& scope() { return scope_; }

 private:
  DType flag_dtype_;
  Program program_;
  Scope scope_;
  ExecEnv env_;
  std::unique_ptr<Executor> executor_;
};

void check_state(const LossScalerState& s, const Row& r) {
  CHECK(s.scale == r.scale);
  CHECK(s.good_steps == r.good);
  CHECK(s.bad_steps == r.bad);
  CHECK(s.skipped_steps == r.skipped);
  CHECK(s.consecutive_skips_at_min == r.at_min);
}

// Runs the table through `step` (one update) and `state` (the state now).
template <typename Step, typename State>
void run_table_with(const std::vector<Row>& rows, float init, Step step, State state) {
  float prev_scale = init;
  int64_t step_no = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    for (int k = 0; k < r.repeat; ++k) {
      step(r.found_inf);
      ++step_no;
      if (k + 1 < r.repeat) {
        INFO("row " << i << ", step " << step_no << " (inside the row)");
        REQUIRE(state().scale == prev_scale);
      }
    }
    INFO("row " << i << ", after step " << step_no << " (" << (r.found_inf ? "overflow" : "finite") << ")");
    check_state(state(), r);
    prev_scale = r.scale;
  }
}

void run_table(const LossScalerConfig& c, const std::vector<Row>& rows) {
  const float init = mix::amp::initial_state(c).scale;
  {
    INFO("host LossScaler");
    LossScaler scaler(c);
    run_table_with(
        rows, init, [&](bool inf) { scaler.update(inf); }, [&] { return scaler.state(); });
  }
  {
    INFO("update_loss_scaling op through the Executor");
    ScalerProgram prog(c);
    run_table_with(
        rows, init, [&](bool inf) { prog.step(inf); }, [&] { return prog.state(); });
  }
}

LossScalerConfig paddle() { return mix::amp::preset("paddle"); }

}  // namespace

// ---- presets -----------------------------------------------------------------------

TEST_CASE("presets hold the documented parameters", "[amp][loss_scaler]") {
  const LossScalerConfig p = mix::amp::preset("paddle");
  CHECK(p.mode == LossScalerConfig::Mode::dynamic);
  CHECK(p.init_loss_scaling == 32768.f);
  CHECK(p.incr_every_n_steps == 1000);
  CHECK(p.decr_every_n_nan_or_inf == 2);
  CHECK(p.incr_ratio == 2.f);
  CHECK(p.decr_ratio == 0.8f);
  CHECK(p.min_loss_scaling == 1.f);
  CHECK(p.on_min_scale == LossScalerConfig::OnMinScale::error);
  CHECK(p.max_skips_at_min == 100);

  const LossScalerConfig t = mix::amp::preset("pytorch");
  CHECK(t.mode == LossScalerConfig::Mode::dynamic);
  CHECK(t.init_loss_scaling == 65536.f);
  CHECK(t.incr_every_n_steps == 2000);
  CHECK(t.incr_ratio == 2.f);
  CHECK(t.decr_every_n_nan_or_inf == 1);
  CHECK(t.decr_ratio == 0.5f);

  CHECK(mix::amp::preset("static").mode == LossScalerConfig::Mode::static_scale);
  CHECK(mix::amp::preset("static").init_loss_scaling == 32768.f);
  CHECK(mix::amp::preset("none").mode == LossScalerConfig::Mode::none);
  CHECK(mix::amp::initial_state(mix::amp::preset("none")).scale == 1.f);
}

TEST_CASE("an unknown preset is an error that lists the valid ones", "[amp][loss_scaler]") {
  REQUIRE_THROWS_AS(mix::amp::preset("apex"), mix::Error);
  REQUIRE_THROWS_WITH(mix::amp::preset("apex"), Contains("'apex'") && Contains("paddle") && Contains("pytorch") &&
                                                    Contains("static") && Contains("none"));
  REQUIRE_THROWS_WITH(mix::amp::preset(""), Contains("paddle"));
}

TEST_CASE("mode and on-min-scale names parse and print", "[amp][loss_scaler]") {
  using M = LossScalerConfig::Mode;
  using O = LossScalerConfig::OnMinScale;
  for (M m : {M::dynamic, M::static_scale, M::none}) CHECK(mix::amp::parse_mode(mix::amp::mode_name(m)) == m);
  CHECK(mix::amp::mode_name(M::static_scale) == "static");
  for (O o : {O::error, O::continue_}) CHECK(mix::amp::parse_on_min_scale(mix::amp::on_min_scale_name(o)) == o);
  CHECK(mix::amp::on_min_scale_name(O::continue_) == "continue");
  REQUIRE_THROWS_WITH(mix::amp::parse_mode("dynamc"), Contains("dynamic") && Contains("static") && Contains("none"));
  REQUIRE_THROWS_WITH(mix::amp::parse_on_min_scale("ignore"), Contains("error") && Contains("continue"));
}

TEST_CASE("configs out of range are rejected naming the field", "[amp][loss_scaler]") {
  auto bad = [](auto edit, const char* field) {
    LossScalerConfig c = paddle();
    edit(c);
    REQUIRE_THROWS_WITH(LossScaler(c), Contains(field));
  };
  bad([](LossScalerConfig& c) { c.incr_every_n_steps = 0; }, "incr_every_n_steps");
  bad([](LossScalerConfig& c) { c.decr_every_n_nan_or_inf = 0; }, "decr_every_n_nan_or_inf");
  bad([](LossScalerConfig& c) { c.incr_ratio = 0.5f; }, "incr_ratio");
  bad([](LossScalerConfig& c) { c.decr_ratio = 1.5f; }, "decr_ratio");
  bad([](LossScalerConfig& c) { c.decr_ratio = 0.f; }, "decr_ratio");
  bad([](LossScalerConfig& c) { c.min_loss_scaling = 0.f; }, "min_loss_scaling");
  bad([](LossScalerConfig& c) { c.min_loss_scaling = 65536.f; }, "min_loss_scaling");
  bad([](LossScalerConfig& c) { c.init_loss_scaling = kInf; }, "init_loss_scaling");
  bad([](LossScalerConfig& c) { c.init_loss_scaling = -1.f; }, "init_loss_scaling");
  // A static scale needs no dynamic parameters.
  LossScalerConfig s = mix::amp::preset("static");
  s.incr_every_n_steps = 0;
  REQUIRE_NOTHROW(LossScaler(s));
}

// ---- the update, table by table ----------------------------------------------------

TEST_CASE("paddle semantics with short intervals (grow every 3, shrink every 2)", "[amp][loss_scaler]") {
  LossScalerConfig c = paddle();
  c.incr_every_n_steps = 3;
  c.decr_every_n_nan_or_inf = 2;
  const float s1 = 65536.f;
  const float s2 = s1 * 0.8f;  // 52428.8 rounded to float
  const float s3 = s2 * 0.8f;
  run_table(c, {
                   // repeat, found_inf, scale, good, bad, skipped, at_min
                   {1, F, 32768.f, 1, 0, 0, 0},
                   {1, F, 32768.f, 2, 0, 0, 0},
                   {1, F, s1, 0, 0, 0, 0},  // 3 good steps: x2, good back to 0
                   {1, T, s1, 0, 1, 1, 0},  // one overflow: counted, no decrease yet
                   {1, F, s1, 1, 0, 1, 0},  // a finite step clears bad
                   {1, F, s1, 2, 0, 1, 0},
                   {1, T, s1, 0, 1, 2, 0},  // an overflow clears good (2 of 3 lost)
                   {1, T, s2, 0, 0, 3, 0},  // the 2nd consecutive overflow: x0.8, bad back to 0
                   {1, T, s2, 0, 1, 4, 0},
                   {1, T, s3, 0, 0, 5, 0},
                   {1, F, s3, 1, 0, 5, 0},
                   {1, F, s3, 2, 0, 5, 0},
                   {1, F, s3 * 2.f, 0, 0, 5, 0},
                   {3, F, s3 * 4.f, 0, 0, 5, 0},
               });
}

TEST_CASE("paddle defaults: x2 after 1000 good steps, x0.8 after 2 overflows", "[amp][loss_scaler]") {
  const float up = 65536.f;
  const float down = up * 0.8f;
  run_table(paddle(), {
                          {999, F, 32768.f, 999, 0, 0, 0},
                          {1, F, up, 0, 0, 0, 0},
                          {1, T, up, 0, 1, 1, 0},
                          {1, T, down, 0, 0, 2, 0},
                          {500, F, down, 500, 0, 2, 0},
                          {1, T, down, 0, 1, 3, 0},  // 500 good steps lost
                          {999, F, down, 999, 0, 3, 0},
                          {1, F, down * 2.f, 0, 0, 3, 0},
                          // overflows that are not consecutive never decrease the scale
                          {1, T, down * 2.f, 0, 1, 4, 0},
                          {1, F, down * 2.f, 1, 0, 4, 0},
                          {1, T, down * 2.f, 0, 1, 5, 0},
                          {1, F, down * 2.f, 1, 0, 5, 0},
                      });
}

TEST_CASE("pytorch preset: x2 after 2000 good steps, x0.5 on every overflow", "[amp][loss_scaler]") {
  run_table(mix::amp::preset("pytorch"), {
                                             {1, T, 32768.f, 0, 0, 1, 0},
                                             {1, T, 16384.f, 0, 0, 2, 0},
                                             {1999, F, 16384.f, 1999, 0, 2, 0},
                                             {1, F, 32768.f, 0, 0, 2, 0},
                                             {1, F, 32768.f, 1, 0, 2, 0},
                                             {1, T, 16384.f, 0, 0, 3, 0},
                                             {1, F, 16384.f, 1, 0, 3, 0},
                                         });
}

TEST_CASE("static preset never changes the scale but counts skipped steps", "[amp][loss_scaler]") {
  // A static scale cannot go lower: each overflow is a skip at its minimum.
  run_table(mix::amp::preset("static"), {
                                            {1, F, 32768.f, 0, 0, 0, 0},
                                            {3, T, 32768.f, 0, 0, 3, 3},
                                            {5000, F, 32768.f, 0, 0, 3, 0},
                                            {1, T, 32768.f, 0, 0, 4, 1},
                                        });
  LossScalerConfig c = mix::amp::preset("static");
  c.init_loss_scaling = 128.f;  // --init-loss-scaling 128
  run_table(c, {
                   {2, T, 128.f, 0, 0, 2, 2},
                   {2000, F, 128.f, 0, 0, 2, 0},
               });
}

TEST_CASE("a static scale that overflows every step stops with a message", "[amp][loss_scaler]") {
  // A static scale above min_loss_scaling (1) used to skip forever: never "at the minimum".
  LossScalerConfig c = mix::amp::preset("static");
  c.init_loss_scaling = 1e30f;
  c.max_skips_at_min = 5;
  LossScaler s(c);
  for (int i = 0; i < 4; ++i) s.update(T);
  REQUIRE_THROWS_WITH(s.update(T), Contains("5 consecutive steps") && Contains("static loss scale 1e+30") &&
                                       Contains("cannot go lower") && Contains("lower --init-loss-scaling") &&
                                       Contains("--on-min-scale continue"));
  c.on_min_scale = LossScalerConfig::OnMinScale::continue_;
  LossScaler keeps_going(c);
  for (int i = 0; i < 10; ++i) keeps_going.update(T);
  CHECK(keeps_going.state().skipped_steps == 10);
}

TEST_CASE("none preset keeps scale 1 and still skips overflowed steps", "[amp][loss_scaler]") {
  LossScalerConfig c = mix::amp::preset("none");
  // Scale 1 is the minimum, so overflows count towards the stuck-at-minimum limit.
  run_table(c, {
                   {1, F, 1.f, 0, 0, 0, 0},
                   {2, T, 1.f, 0, 0, 2, 2},
                   {1, F, 1.f, 0, 0, 2, 0},
                   {3000, F, 1.f, 0, 0, 2, 0},
               });
  c.init_loss_scaling = 1024.f;  // ignored: mode none never scales
  CHECK(LossScaler(c).scale() == 1.f);
}

TEST_CASE("the scale does not grow into infinity", "[amp][loss_scaler]") {
  LossScalerConfig c = paddle();
  c.incr_every_n_steps = 1;
  c.init_loss_scaling = 0x1p126f;
  run_table(c, {
                   {1, F, 0x1p127f, 0, 0, 0, 0},
                   {1, F, 0x1p127f, 0, 0, 0, 0},  // 2^128 is inf in float: kept, good reset
                   {1, F, 0x1p127f, 0, 0, 0, 0},
                   {1, T, 0x1p127f, 0, 1, 1, 0},
                   {1, T, 0x1p127f * 0.8f, 0, 0, 2, 0},
               });
  c.init_loss_scaling = std::numeric_limits<float>::max();
  c.incr_every_n_steps = 2;
  run_table(c, {
                   {1, F, std::numeric_limits<float>::max(), 1, 0, 0, 0},
                   {1, F, std::numeric_limits<float>::max(), 0, 0, 0, 0},
               });
}

TEST_CASE("the scale is clamped at min_loss_scaling", "[amp][loss_scaler]") {
  LossScalerConfig c = paddle();
  c.init_loss_scaling = 2.f;
  c.decr_every_n_nan_or_inf = 1;
  const float a = 2.f * 0.8f, b = a * 0.8f, d = b * 0.8f;  // 1.6, 1.28, 1.024; then 0.8192 < 1
  run_table(c, {
                   {1, T, a, 0, 0, 1, 0},
                   {1, T, b, 0, 0, 2, 0},
                   {1, T, d, 0, 0, 3, 0},
                   {1, T, 1.f, 0, 0, 4, 0},  // lands on the minimum: not yet a skip at the minimum
                   {1, T, 1.f, 0, 0, 5, 1},
                   {1, T, 1.f, 0, 0, 6, 2},
                   {1, F, 1.f, 1, 0, 6, 0},  // a finite step resets the count
                   {1, T, 1.f, 0, 0, 7, 1},
               });
  c.init_loss_scaling = 1.f;
  c.min_loss_scaling = 0.25f;
  c.decr_ratio = 0.5f;
  run_table(c, {
                   {1, T, 0.5f, 0, 0, 1, 0},
                   {1, T, 0.25f, 0, 0, 2, 0},
                   {1, T, 0.25f, 0, 0, 3, 1},
               });
}

// ---- many skips at the minimum --------------------------------------------------------

TEST_CASE("on_min_scale error throws after max_skips_at_min skips at the minimum", "[amp][loss_scaler]") {
  LossScalerConfig c = paddle();
  c.init_loss_scaling = 1.f;
  c.decr_every_n_nan_or_inf = 1;
  c.max_skips_at_min = 3;
  LossScaler s(c);
  s.update(T);
  s.update(T);
  s.update(F);  // resets the count
  s.update(T);
  s.update(T);
  REQUIRE(s.state().consecutive_skips_at_min == 2);
  REQUIRE_THROWS_AS(s.update(T), mix::Error);
  // The state of the failing step is recorded before the throw.
  CHECK(s.state().consecutive_skips_at_min == 3);
  CHECK(s.state().skipped_steps == 5);
  CHECK(s.scale() == 1.f);
}

TEST_CASE("with the paddle defaults the 100th skip at the minimum stops training", "[amp][loss_scaler]") {
  LossScaler s(paddle());
  int steps = 0;
  while (s.scale() > 1.f) {
    s.update(T);
    ++steps;
  }
  CHECK(steps == 94);  // 47 decreases of x0.8 take 32768 below 1; two overflows each
  CHECK(s.state().consecutive_skips_at_min == 0);
  for (int i = 1; i < 100; ++i) REQUIRE_NOTHROW(s.update(T));
  CHECK(s.state().consecutive_skips_at_min == 99);
  try {
    s.update(T);
    FAIL("no error after 100 skips at the minimum");
  } catch (const mix::Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("stuck at the minimum"));
    CHECK_THAT(msg, Contains("100 consecutive steps"));
    CHECK_THAT(msg, Contains("NaN"));
    CHECK_THAT(msg, Contains("--lr"));
    CHECK_THAT(msg, Contains("--on-min-scale continue"));
    // At the default minimum of 1, --loss-scaling none (scale 1) would overflow the same.
    CHECK_THAT(msg, !Contains("--loss-scaling none"));
    CHECK_THAT(msg, Contains("fp32"));
  }
  // Above a minimum of 1, unscaled FP16 may still fit: a lower minimum or no scaling can help.
  LossScalerConfig c = paddle();
  c.init_loss_scaling = c.min_loss_scaling = 64.f;
  c.max_skips_at_min = 1;
  REQUIRE_THROWS_WITH(LossScaler(c).update(T), Contains("lower --min-loss-scaling") && Contains("--loss-scaling none"));
}

TEST_CASE("on_min_scale continue keeps skipping without an error", "[amp][loss_scaler]") {
  LossScalerConfig c = paddle();
  c.on_min_scale = LossScalerConfig::OnMinScale::continue_;
  LossScaler s(c);
  for (int i = 0; i < 1000; ++i) REQUIRE_NOTHROW(s.update(T));
  CHECK(s.scale() == 1.f);
  CHECK(s.state().skipped_steps == 1000);
  CHECK(s.state().consecutive_skips_at_min == 1000 - 94);
  s.update(F);
  CHECK(s.state().consecutive_skips_at_min == 0);
  CHECK(s.state().good_steps == 1);
}

TEST_CASE("max_skips_at_min 0 never reports the scale stuck", "[amp][loss_scaler]") {
  LossScalerConfig c = mix::amp::preset("none");
  c.max_skips_at_min = 0;
  LossScaler s(c);
  for (int i = 0; i < 500; ++i) REQUIRE_NOTHROW(s.update(T));
  CHECK(s.state().skipped_steps == 500);
}

TEST_CASE("a none scaler that overflows every step stops with a message", "[amp][loss_scaler]") {
  LossScalerConfig c = mix::amp::preset("none");
  c.max_skips_at_min = 5;
  LossScaler s(c);
  for (int i = 0; i < 4; ++i) s.update(T);
  // --loss-scaling none is what this run has: not offered as a way out.
  REQUIRE_THROWS_WITH(s.update(T), Contains("5 consecutive steps") && Contains("--on-min-scale continue") &&
                                       Contains("--precision fp32") && !Contains("--loss-scaling none"));
}

TEST_CASE("a scaler resumes from a saved state", "[amp][loss_scaler]") {
  LossScaler a(paddle());
  for (int i = 0; i < 700; ++i) a.update(i % 300 == 299);
  LossScaler b(paddle(), a.state());
  for (int i = 0; i < 1500; ++i) {
    const bool inf = i % 650 == 649;
    a.update(inf);
    b.update(inf);
  }
  CHECK(b.scale() == a.scale());
  CHECK(b.state().good_steps == a.state().good_steps);
  CHECK(b.state().bad_steps == a.state().bad_steps);
  CHECK(b.state().skipped_steps == a.state().skipped_steps);
}

// ---- the update_loss_scaling op ------------------------------------------------------

TEST_CASE("update_loss_scaling attributes round-trip the config", "[amp][loss_scaler][op]") {
  LossScalerConfig c = mix::amp::preset("pytorch");
  c.mode = LossScalerConfig::Mode::static_scale;
  c.min_loss_scaling = 0.5f;
  c.on_min_scale = LossScalerConfig::OnMinScale::continue_;
  c.max_skips_at_min = 7;
  mix::OpDesc op;
  op.type = "update_loss_scaling";
  op.attrs = mix::amp::to_op_attrs(c);
  const LossScalerConfig r = mix::amp::from_op_attrs(op);
  CHECK(r.mode == c.mode);
  CHECK(r.incr_every_n_steps == c.incr_every_n_steps);
  CHECK(r.decr_every_n_nan_or_inf == c.decr_every_n_nan_or_inf);
  CHECK(r.incr_ratio == c.incr_ratio);
  CHECK(r.decr_ratio == c.decr_ratio);
  CHECK(r.min_loss_scaling == c.min_loss_scaling);
  CHECK(r.on_min_scale == c.on_min_scale);
  CHECK(r.max_skips_at_min == c.max_skips_at_min);

  op.attrs["incr_every_n_steps"] = std::string("many");
  REQUIRE_THROWS_WITH(mix::amp::from_op_attrs(op), Contains("incr_every_n_steps"));
  op.attrs = mix::amp::to_op_attrs(c);
  op.attrs["mode"] = std::string("adaptive");
  REQUIRE_THROWS_WITH(mix::amp::from_op_attrs(op), Contains("adaptive"));
}

TEST_CASE("update_loss_scaling updates the persistable state in place", "[amp][loss_scaler][op]") {
  ScalerProgram prog(paddle());
  // Inference declared the outputs (the inputs themselves) with their dtypes.
  CHECK(prog.program().var("loss_scaling").dtype == DType::f32);
  CHECK(prog.program().var("loss_scaling").persistable);
  CHECK(prog.program().var("skips_at_min").dtype == DType::i64);

  const Tensor before = prog.scope().get("loss_scaling");
  prog.step(T);
  prog.step(T);
  CHECK(prog.scope().get("loss_scaling").shares_storage(before));
  CHECK(prog.state().scale == 32768.f * 0.8f);
  CHECK(prog.state().skipped_steps == 2);
  // The flag is a temporary: released after its last use; the state is not.
  CHECK_FALSE(prog.scope().has("found_inf"));
}

TEST_CASE("update_loss_scaling reads an f32 FoundInfinite flag; NaN counts as an overflow", "[amp][loss_scaler][op]") {
  LossScalerConfig c = paddle();
  c.decr_every_n_nan_or_inf = 1;
  ScalerProgram prog(c, DType::f32);
  prog.feed_flag(0.f);
  prog.run();
  CHECK(prog.state().good_steps == 1);
  prog.feed_flag(kNaN);
  prog.run();
  CHECK(prog.state().skipped_steps == 1);
  CHECK(prog.state().scale == 32768.f * 0.8f);
  prog.feed_flag(1.f);
  prog.run();
  CHECK(prog.state().skipped_steps == 2);
}

// The op raises the stuck error; check_loss_scale_not_stuck, which the trainer
// runs after every step (the CUDA op leaves the error to it), raises the same
// error from the state the step left in the scope, and only when stuck.
TEST_CASE("update_loss_scaling raises the stuck error through the Executor, and so does the host check",
          "[amp][loss_scaler][op]") {
  LossScalerConfig c = paddle();
  c.init_loss_scaling = 1.f;
  c.max_skips_at_min = 2;
  ScalerProgram prog(c);
  prog.step(T);
  REQUIRE_NOTHROW(mix::amp::check_loss_scale_not_stuck(prog.program(), prog.scope()));  // one skip at the minimum
  auto error_of = [](auto&& f) {
    try {
      f();
    } catch (const mix::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string op_error = error_of([&] { prog.step(T); });
  CHECK_THAT(op_error,
             Contains("stuck at the minimum") && Contains("--on-min-scale") && Contains("update_loss_scaling"));
  CHECK(prog.state().consecutive_skips_at_min == 2);  // written back before the error
  CHECK(prog.state().skipped_steps == 2);
  const std::string check_error = error_of([&] { mix::amp::check_loss_scale_not_stuck(prog.program(), prog.scope()); });
  CHECK_THAT(check_error, Contains("2 consecutive steps") && Contains("--on-min-scale continue"));
  CHECK(check_error == op_error);  // the executor's words, the op named as the executor names it

  c.on_min_scale = LossScalerConfig::OnMinScale::continue_;
  ScalerProgram cont(c);
  for (int i = 0; i < 10; ++i) REQUIRE_NOTHROW(cont.step(T));
  CHECK(cont.state().consecutive_skips_at_min == 10);
  CHECK_NOTHROW(mix::amp::check_loss_scale_not_stuck(cont.program(), cont.scope()));  // "continue": stuck, no error
  CHECK_NOTHROW(mix::amp::check_loss_scale_not_stuck(Program{}, mix::Scope{}));       // no scaler op: nothing to check
}

TEST_CASE("update_loss_scaling rejects state of the wrong dtype when built", "[amp][loss_scaler][op]") {
  Program p;
  VarDesc flag = persistable("found_inf", DType::i32);
  p.add_var(flag);
  p.add_var(persistable("loss_scaling", DType::f32));
  p.add_var(persistable("good", DType::i32));  // should be i64
  for (const char* n : {"bad", "skipped", "at_min"}) p.add_var(persistable(n, DType::i64));
  auto op = mix::make_op("update_loss_scaling",
                         {{"FoundInfinite", {"found_inf"}},
                          {"PrevLossScaling", {"loss_scaling"}},
                          {"InGoodSteps", {"good"}},
                          {"InBadSteps", {"bad"}},
                          {"Skipped", {"skipped"}},
                          {"ConsecutiveSkipsAtMin", {"at_min"}}},
                         {{"LossScaling", {"loss_scaling"}},
                          {"OutGoodSteps", {"good"}},
                          {"OutBadSteps", {"bad"}},
                          {"OutSkipped", {"skipped"}},
                          {"OutConsecutiveSkipsAtMin", {"at_min"}}});
  REQUIRE_THROWS_WITH(p.append_op(op), Contains("InGoodSteps") && Contains("i64"));
}

// ---- check_finite_and_unscale ---------------------------------------------------------

namespace {

VarDesc grad_var(const std::string& name, const mix::Shape& shape, DType dtype) {
  VarDesc v;
  v.name = name;
  v.shape = shape;
  v.dtype = dtype;
  return v;
}

Tensor f16_tensor(const mix::Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::f16);
  REQUIRE(t.numel() == static_cast<int64_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) {
    const mix::half_t h = mix::to_half(values[i]);
    // Inputs must be exactly representable, so the expected outputs are exact.
    if (std::isfinite(values[i])) REQUIRE(mix::to_float(h) == values[i]);
    t.data<mix::half_t>()[i] = h;
  }
  return t;
}

std::vector<int32_t> i32_values(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

// Three gradients unscaled in place by one check_finite_and_unscale.
struct UnscaleProgram {
  Program p;
  Scope scope;
  ExecEnv env;
  std::vector<std::string> grads{"fc1.weight@GRAD", "fc1.bias@GRAD", "fc2.weight@GRAD"};

  explicit UnscaleProgram(bool with_prev_flag = false) {
    p.add_var(grad_var(grads[0], {2, 2}, DType::f32));
    p.add_var(grad_var(grads[1], {3}, DType::f32));
    p.add_var(grad_var(grads[2], {4}, DType::f32));
    p.add_var(persistable("loss_scaling", DType::f32));
    std::map<std::string, std::vector<std::string>> ins{{"X", grads}, {"Scale", {"loss_scaling"}}};
    if (with_prev_flag) {
      p.add_var(grad_var("prev_found_inf", {1}, DType::i32));
      ins["FoundInfiniteIn"] = {"prev_found_inf"};
    }
    p.append_op(
        mix::make_op("check_finite_and_unscale", ins,
                     {{"Out", grads}, {"FoundInfinite", {"found_inf"}}, {"FoundInfiniteEach", {"found_inf.each"}}}));
  }
  void feed(const std::vector<std::vector<float>>& values, float scale) {
    scope.set(grads[0], Tensor::from_floats({2, 2}, values[0]));
    scope.set(grads[1], Tensor::from_floats({3}, values[1]));
    scope.set(grads[2], Tensor::from_floats({4}, values[2]));
    scope.set("loss_scaling", Tensor::from_floats({1}, {scale}));
  }
  void run() {
    std::set<std::string> keep(grads.begin(), grads.end());
    keep.insert("found_inf");
    keep.insert("found_inf.each");
    Executor(p, keep).run(scope, env);
  }
  int found_inf() const { return scope.get("found_inf").data<int32_t>()[0]; }
  // FoundInfiniteEach: which of the three gradients held a non-finite value.
  std::vector<int32_t> each() const { return i32_values(scope.get("found_inf.each")); }
  std::vector<float> out(size_t i) const { return scope.get(grads[i]).to_floats(); }
};

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

void check_floats(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(same_float(got[i], want[i]));
  }
}

std::vector<float> times(const std::vector<float>& v, float s) {
  std::vector<float> r;
  for (float x : v) r.push_back(x * s);
  return r;
}

}  // namespace

TEST_CASE("check_finite_and_unscale declares its outputs", "[amp][unscale][op]") {
  UnscaleProgram u;
  CHECK(u.p.var("found_inf").dtype == DType::i32);
  CHECK(u.p.var("found_inf").shape == mix::Shape{1});
  CHECK(u.p.var("found_inf.each").shape == mix::Shape{3});  // one flag per gradient
  CHECK(u.p.var(u.grads[0]).dtype == DType::f32);
  CHECK(u.p.var(u.grads[0]).shape == mix::Shape{2, 2});
}

TEST_CASE("check_finite_and_unscale divides finite gradients by the scale in place", "[amp][unscale][op]") {
  UnscaleProgram u;
  const std::vector<std::vector<float>> g{
      {1024.f, -512.f, 3.f, 0.f}, {0.25f, -1.f, 65504.f}, {1e-3f, 7.f, -7.f, 2048.f}};
  u.feed(g, 1024.f);
  const Tensor before = u.scope.get(u.grads[1]);
  u.run();
  CHECK(u.found_inf() == 0);
  for (size_t i = 0; i < 3; ++i) check_floats(u.out(i), times(g[i], 1.f / 1024.f));  // a power of two: exact
  CHECK(u.out(0)[0] == 1.f);
  CHECK(u.out(0)[1] == -0.5f);
  CHECK(u.scope.get(u.grads[1]).shares_storage(before));  // in place

  // A scale that is no power of two: multiplied by the rounded reciprocal, as the GPU kernel does.
  u.feed(g, 3.f);
  u.run();
  CHECK(u.found_inf() == 0);
  for (size_t i = 0; i < 3; ++i) check_floats(u.out(i), times(g[i], 1.f / 3.f));
}

TEST_CASE("check_finite_and_unscale raises found_inf for inf or NaN in any gradient", "[amp][unscale][op]") {
  const std::vector<float> g0{1.f, 2.f, 3.f, 4.f}, g2{8.f, 16.f, -32.f, 64.f};
  for (float bad : {kInf, -kInf, kNaN}) {
    INFO("non-finite value " << bad << " in the 2nd of 3 gradients");
    UnscaleProgram u;
    const std::vector<float> g1{2.f, bad, -4.f};
    u.feed({g0, g1, g2}, 4.f);
    u.run();
    CHECK(u.found_inf() == 1);
    CHECK(u.each() == std::vector<int32_t>{0, 1, 0});  // provenance names the 2nd gradient only
    // Every tensor is still unscaled: the step is skipped, the values need not be special.
    check_floats(u.out(0), times(g0, 0.25f));
    check_floats(u.out(1), times(g1, 0.25f));
    check_floats(u.out(2), times(g2, 0.25f));
  }
  UnscaleProgram last;
  last.feed({g0, {1.f, 1.f, 1.f}, {1.f, 1.f, 1.f, kNaN}}, 2.f);
  last.run();
  CHECK(last.found_inf() == 1);
  CHECK(last.each() == std::vector<int32_t>{0, 0, 1});

  // The flags are recomputed each run: a clean step after a bad one reports 0.
  last.feed({g0, {1.f, 1.f, 1.f}, g2}, 2.f);
  last.run();
  CHECK(last.found_inf() == 0);
  CHECK(last.each() == std::vector<int32_t>{0, 0, 0});
}

TEST_CASE("check_finite_and_unscale ORs in FoundInfiniteIn", "[amp][unscale][op]") {
  const std::vector<std::vector<float>> g{{1.f, 2.f, 3.f, 4.f}, {1.f, 2.f, 3.f}, {1.f, 2.f, 3.f, 4.f}};
  for (int prev : {0, 1}) {
    UnscaleProgram u(true);
    u.feed(g, 2.f);
    Tensor flag = Tensor::empty({1}, DType::i32);
    flag.data<int32_t>()[0] = prev;
    u.scope.set("prev_found_inf", flag);
    u.run();
    CHECK(u.found_inf() == prev);
  }
}

TEST_CASE("check_finite_and_unscale rejects a non-positive scale", "[amp][unscale][op]") {
  UnscaleProgram u;
  u.feed({{1.f, 2.f, 3.f, 4.f}, {1.f, 2.f, 3.f}, {1.f, 2.f, 3.f, 4.f}}, 0.f);
  REQUIRE_THROWS_WITH(u.run(), Contains("loss scale") && Contains("check_finite_and_unscale"));
}

TEST_CASE("check_finite_and_unscale on FP16 gradients rounds to FP16", "[amp][unscale][op]") {
  Program p;
  p.add_var(grad_var("h", {3}, DType::f16));
  p.add_var(persistable("loss_scaling", DType::f32));
  p.append_op(mix::make_op("check_finite_and_unscale", {{"X", {"h"}}, {"Scale", {"loss_scaling"}}},
                           {{"Out", {"h"}}, {"FoundInfinite", {"found_inf"}}}));
  CHECK(p.var("h").dtype == DType::f16);
  Scope scope;
  ExecEnv env;
  scope.set("h", f16_tensor({3}, {2048.f, 0x1p-24f, -3.f}));
  scope.set("loss_scaling", Tensor::from_floats({1}, {1024.f}));
  Executor(p, {"h", "found_inf"}).run(scope, env);
  CHECK(scope.get("found_inf").data<int32_t>()[0] == 0);
  // 2^-24 / 1024 = 2^-34 is below the smallest FP16 subnormal: it flushes to
  // zero, which is why the fused op below unscales into FP32.
  check_floats(scope.get("h").to_floats(), {2.f, 0.f, -3.f / 1024.f});
}

// ---- cast_check_finite_and_unscale ------------------------------------------------------

namespace {

// FP16 gradients after the all-reduce, cast and unscaled into FP32 masters' grads.
struct FusedProgram {
  Program p;
  Scope scope;
  ExecEnv env;
  std::vector<std::string> xs{"fc1.weight.cast_fp16@GRAD", "fc2.weight.cast_fp16@GRAD", "head.weight.cast_fp16@GRAD"};
  std::vector<std::string> outs{"fc1.weight@GRAD", "fc2.weight@GRAD", "head.weight@GRAD"};
  std::vector<mix::Shape> shapes{{2, 3}, {4}, {2}};

  FusedProgram() {
    for (size_t i = 0; i < 3; ++i) p.add_var(grad_var(xs[i], shapes[i], DType::f16));
    p.add_var(persistable("loss_scaling", DType::f32));
    p.append_op(
        mix::make_op("cast_check_finite_and_unscale", {{"X", xs}, {"Scale", {"loss_scaling"}}},
                     {{"Out", outs}, {"FoundInfinite", {"found_inf"}}, {"FoundInfiniteEach", {"found_inf.each"}}}));
  }
  void run(const std::vector<std::vector<float>>& values, float scale) {
    for (size_t i = 0; i < 3; ++i) scope.set(xs[i], f16_tensor(shapes[i], values[i]));
    scope.set("loss_scaling", Tensor::from_floats({1}, {scale}));
    std::set<std::string> keep(outs.begin(), outs.end());
    keep.insert(xs.begin(), xs.end());  // to check they are left alone
    keep.insert("found_inf");
    keep.insert("found_inf.each");
    Executor(p, keep).run(scope, env);
  }
  int found_inf() const { return scope.get("found_inf").data<int32_t>()[0]; }
  // FoundInfiniteEach: which of the three gradients held a non-finite value.
  std::vector<int32_t> each() const { return i32_values(scope.get("found_inf.each")); }
  const Tensor& out(size_t i) const { return scope.get(outs[i]); }
};

}  // namespace

TEST_CASE("cast_check_finite_and_unscale declares FP32 outputs of the inputs' shapes", "[amp][unscale][op]") {
  FusedProgram f;
  for (size_t i = 0; i < 3; ++i) {
    CHECK(f.p.var(f.outs[i]).dtype == DType::f32);
    CHECK(f.p.var(f.outs[i]).shape == f.shapes[i]);
    CHECK(f.p.var(f.xs[i]).dtype == DType::f16);  // the inputs stay FP16
  }
  CHECK(f.p.var("found_inf").dtype == DType::i32);
  CHECK(f.p.var("found_inf.each").dtype == DType::i32);
  CHECK(f.p.var("found_inf.each").shape == mix::Shape{3});
}

TEST_CASE("cast_check_finite_and_unscale casts FP16 gradients to FP32 and unscales exactly", "[amp][unscale][op]") {
  FusedProgram f;
  // FP16 values whose quotients by 1024 are exact in FP32: the largest half, the
  // smallest normal and the smallest subnormal half among them.
  const std::vector<std::vector<float>> g{
      {2048.f, -1.f, 0.5f, 65504.f, 0x1p-14f, 0x1p-24f}, {3.f, -1536.f, 0.f, 1000.f}, {-0x1p-24f, 7.f}};
  f.run(g, 1024.f);
  CHECK(f.found_inf() == 0);
  CHECK(f.each() == std::vector<int32_t>{0, 0, 0});
  for (size_t i = 0; i < 3; ++i) {
    CHECK(f.out(i).dtype() == DType::f32);
    check_floats(f.out(i).to_floats(), times(g[i], 1.f / 1024.f));
  }
  check_floats(f.out(0).to_floats(), {2.f, -0x1p-10f, 0x1p-11f, 63.96875f, 0x1p-24f, 0x1p-34f});
  check_floats(f.out(1).to_floats(), {3.f / 1024.f, -1.5f, 0.f, 1000.f / 1024.f});
  check_floats(f.out(2).to_floats(), {-0x1p-34f, 7.f / 1024.f});
  // The FP16 inputs are left as they were.
  CHECK(f.scope.get(f.xs[0]).dtype() == DType::f16);
  CHECK(f.scope.get(f.xs[0]).item_float(0) == 2048.f);
}

TEST_CASE("cast_check_finite_and_unscale raises found_inf for FP16 inf and NaN", "[amp][unscale][op]") {
  for (float bad : {kInf, -kInf, kNaN}) {
    INFO("non-finite FP16 value " << bad << " in the 2nd of 3 gradients");
    FusedProgram f;
    f.run({{1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {8.f, bad, 16.f, 32.f}, {1.f, 2.f}}, 8.f);
    CHECK(f.found_inf() == 1);
    CHECK(f.each() == std::vector<int32_t>{0, 1, 0});  // provenance: only the 2nd gradient
    check_floats(f.out(0).to_floats(), {0.125f, 0.25f, 0.375f, 0.5f, 0.625f, 0.75f});
    check_floats(f.out(1).to_floats(), {1.f, bad, 2.f, 4.f});
    check_floats(f.out(2).to_floats(), {0.125f, 0.25f});
  }
  // An FP16 overflow of the all-reduce: 65504 + 65504 stored as half is inf.
  FusedProgram f;
  f.run({{1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {1.f, 1.f, 1.f, 1.f}, {mix::round_to_half(65504.f + 65504.f), 1.f}}, 2.f);
  CHECK(f.found_inf() == 1);
  CHECK(f.each() == std::vector<int32_t>{0, 0, 1});
}

TEST_CASE("cast_check_finite_and_unscale refuses to turn an FP16 variable into FP32 in place", "[amp][unscale][op]") {
  Program p;
  p.add_var(grad_var("h", {3}, DType::f16));
  p.add_var(persistable("loss_scaling", DType::f32));
  REQUIRE_THROWS_WITH(
      p.append_op(mix::make_op("cast_check_finite_and_unscale", {{"X", {"h"}}, {"Scale", {"loss_scaling"}}},
                               {{"Out", {"h"}}, {"FoundInfinite", {"found_inf"}}})),
      Contains("new variable"));
  // FP32 inputs may be unscaled in place by the fused op too.
  p.add_var(grad_var("g", {2}, DType::f32));
  REQUIRE_NOTHROW(p.append_op(mix::make_op("cast_check_finite_and_unscale", {{"X", {"g"}}, {"Scale", {"loss_scaling"}}},
                                           {{"Out", {"g"}}, {"FoundInfinite", {"found_inf"}}})));
  // X and Out must pair up.
  REQUIRE_THROWS_WITH(
      p.append_op(mix::make_op("check_finite_and_unscale", {{"X", {"g", "h"}}, {"Scale", {"loss_scaling"}}},
                               {{"Out", {"g"}}, {"FoundInfinite", {"found_inf"}}})),
      Contains("Out holds 1"));
}
