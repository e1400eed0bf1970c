// Optimizer update ops: closed-form single steps, and a skipped step (the
// global found_inf set) leaves parameters and state bit-identical.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>

#include "runtime/exec/executor.h"
#include "runtime/exec/init.h"
#include "runtime/ir/op_registry.h"
#include "runtime/optim/lr_schedule.h"
#include "runtime/optim/optimizer.h"

using namespace mix;

namespace {

struct Setup {
  Program p;
  Scope s;
};

// One parameter w [4] with a given gradient, updated by `opt`; skip flag optional.
Setup make(optim::Optimizer& opt, bool with_skip) {
  Setup t;
  t.p.add_var(VarDesc{"w", {4}, DType::f32, true, true, false, {}});
  t.p.add_var(VarDesc{"w@GRAD", {4}, DType::f32, false, false, true, {}});
  if (with_skip) t.p.add_var(VarDesc{"skip", {1}, DType::i32, false, false, true, {}});
  opt.append_update_ops(t.p, {{"w", "w@GRAD"}}, with_skip ? "skip" : "");
  initialize_persistables(t.p, t.s, 1);
  t.s.set("w", Tensor::from_floats({4}, {1.f, -2.f, 0.5f, 3.f}));
  t.s.get(optim::kLearningRate).data<float>()[0] = 0.1f;
  return t;
}

void step(Setup& t, const std::vector<float>& grad, int skip = -1) {
  t.s.set("w@GRAD", Tensor::from_floats({4}, grad));
  if (skip >= 0) {
    Tensor f = Tensor::zeros({1}, DType::i32);
    f.data<int32_t>()[0] = skip;
    t.s.set("skip", f);
  }
  Executor ex(t.p, {});
  ExecEnv env;
  ex.run(t.s, env);
}

std::vector<std::vector<unsigned char>> snapshot(const Setup& t) {
  std::vector<std::vector<unsigned char>> r;
  for (auto& v : t.p.vars())
    if (v.persistable && v.name != optim::kLearningRate) {
      const Tensor& x = t.s.get(v.name);
      const unsigned char* b = static_cast<const unsigned char*>(x.raw());
      r.emplace_back(b, b + x.bytes());
    }
  return r;
}

}  // namespace

TEST_CASE("sgd, momentum and adamw single steps follow PyTorch's formulas", "[optim]") {
  const std::vector<float> g = {0.5f, -1.f, 0.25f, 2.f};
  const std::vector<float> w0 = {1.f, -2.f, 0.5f, 3.f};
  SECTION("sgd with weight decay") {
    auto opt = optim::make_sgd(0.01);
    Setup t = make(*opt, false);
    step(t, g);
    for (int i = 0; i < 4; ++i) CHECK(t.s.get("w").item_float(i) == Approx(w0[i] - 0.1f * (g[i] + 0.01f * w0[i])));
  }
  SECTION("momentum: buffer starts at the gradient, then mu * buf + g") {
    auto opt = optim::make_momentum(0.9);
    Setup t = make(*opt, false);
    step(t, g);
    step(t, g);
    for (int i = 0; i < 4; ++i) {
      const float buf2 = 0.9f * g[i] + g[i];
      CHECK(t.s.get("optimizer.momentum_buffer.w").item_float(i) == Approx(buf2));
      CHECK(t.s.get("w").item_float(i) == Approx(w0[i] - 0.1f * g[i] - 0.1f * buf2));
    }
  }
  SECTION("nesterov momentum with weight decay: p -= lr * (g' + mu * buf), g' = g + wd * p") {
    // torch.optim.SGD(nesterov=True, dampening=0); not a mixtrain flag, but make_momentum's.
    auto opt = optim::make_momentum(0.9, 0.01, /*nesterov=*/true);
    Setup t = make(*opt, false);
    step(t, g);
    step(t, g);
    for (int i = 0; i < 4; ++i) {
      const double g1 = g[i] + 0.01 * w0[i], buf1 = g1;
      const double w1 = w0[i] - 0.1 * (g1 + 0.9 * buf1);
      const double g2 = g[i] + 0.01 * w1, buf2 = 0.9 * buf1 + g2;
      CHECK(t.s.get("optimizer.momentum_buffer.w").item_float(i) == Approx(buf2).epsilon(1e-6));
      CHECK(t.s.get("w").item_float(i) == Approx(w1 - 0.1 * (g2 + 0.9 * buf2)).epsilon(1e-6));
    }
  }
  SECTION("adamw: first step moves each weight by about lr against the gradient sign") {
    auto opt = optim::make_adamw(0.9, 0.999, 1e-8, 0.01);
    Setup t = make(*opt, false);
    step(t, g);
    CHECK(t.s.get(optim::kOptimizerStep).data<int64_t>()[0] == 1);
    for (int i = 0; i < 4; ++i) {
      // m_hat = g, v_hat = g^2: the update is lr * g / (|g| + eps) after the decay.
      const double decayed = w0[i] * (1 - 0.1 * 0.01);
      const double expected = decayed - 0.1 * g[i] / (std::abs(g[i]) + 1e-8);
      CHECK(t.s.get("w").item_float(i) == Approx(expected).epsilon(1e-6));
    }
  }
}

TEST_CASE("a skipped step leaves parameters and optimizer state bit-identical", "[optim]") {
  const std::vector<float> g = {0.5f, -1.f, 0.25f, 2.f};
  std::vector<std::unique_ptr<optim::Optimizer>> opts;
  opts.push_back(optim::make_sgd(0.01));
  opts.push_back(optim::make_momentum(0.9, 0.01, true));
  opts.push_back(optim::make_adamw());
  for (auto& opt : opts) {
    INFO(opt->name());
    Setup t = make(*opt, true);
    step(t, g, 0);  // one real step so the state is not all zeros
    auto before = snapshot(t);
    step(t, {INFINITY, NAN, 1.f, 1.f}, 1);
    CHECK(snapshot(t) == before);
    step(t, g, 0);
    CHECK(snapshot(t) != before);
    CHECK(t.s.get(optim::kOptimizerStep).data<int64_t>()[0] == 2);
  }
}

namespace {

// A matrix w [2, 2] and a bias b [4] after two steps of `opt` with fixed gradients.
std::pair<std::vector<float>, std::vector<float>> two_steps(optim::Optimizer& opt) {
  Program p;
  Scope s;
  p.add_var(VarDesc{"w", {2, 2}, DType::f32, true, true, false, {}});
  p.add_var(VarDesc{"b", {4}, DType::f32, true, true, false, {}});
  p.add_var(VarDesc{"w@GRAD", {2, 2}, DType::f32, false, false, true, {}});
  p.add_var(VarDesc{"b@GRAD", {4}, DType::f32, false, false, true, {}});
  opt.append_update_ops(p, {{"w", "w@GRAD"}, {"b", "b@GRAD"}}, "");
  initialize_persistables(p, s, 1);
  s.set("w", Tensor::from_floats({2, 2}, {1.f, -2.f, 0.5f, 3.f}));
  s.set("b", Tensor::from_floats({4}, {0.5f, 1.f, -1.5f, 2.f}));
  s.get(optim::kLearningRate).data<float>()[0] = 0.1f;
  ExecEnv env;
  for (int k = 0; k < 2; ++k) {
    s.set("w@GRAD", Tensor::from_floats({2, 2}, {0.5f, -1.f, 0.25f, 2.f}));
    s.set("b@GRAD", Tensor::from_floats({4}, {-0.5f, 0.75f, 1.f, -2.f}));
    Executor(p, {}).run(s, env);
  }
  return {s.get("w").to_floats(), s.get("b").to_floats()};
}

}  // namespace

// set_no_decay_1d: the matrix is decayed, the bias is not.
TEST_CASE("set_no_decay_1d leaves 1-D parameters out of weight decay", "[optim]") {
  using Make = std::function<std::unique_ptr<optim::Optimizer>(double)>;
  const std::vector<std::pair<std::string, Make>> makers = {
      {"sgd", [](double wd) { return optim::make_sgd(wd); }},
      {"momentum", [](double wd) { return optim::make_momentum(0.9, wd); }},
      {"adamw", [](double wd) { return optim::make_adamw(0.9, 0.999, 1e-8, wd); }}};
  for (const auto& [name, make_opt] : makers) {
    INFO(name);
    auto decay_all = make_opt(0.1), no_decay = make_opt(0.0), decay_2d = make_opt(0.1);
    decay_2d->set_no_decay_1d(true);
    const auto all = two_steps(*decay_all), none = two_steps(*no_decay), mixed = two_steps(*decay_2d);
    CHECK(mixed.first == all.first);     // w: decayed as before
    CHECK(mixed.second == none.second);  // b: as with no decay at all
    CHECK(all.second != none.second);    // (the decay does move the bias when it applies)
  }
  // Given as an option (--no-decay-1d), it reaches the optimizer make_optimizer makes.
  optim::OptimizerOptions options;
  options.kind = optim::OptimizerKind::adamw;
  options.weight_decay = 0.1;
  options.no_decay_1d = true;
  auto plain = optim::make_adamw(0.9, 0.999, 1e-8, 0.1);
  plain->set_no_decay_1d(true);
  auto decay_all = optim::make_adamw(0.9, 0.999, 1e-8, 0.1);
  CHECK(two_steps(*optim::make_optimizer(options)) == two_steps(*plain));
  CHECK(two_steps(*optim::make_optimizer(options)) != two_steps(*decay_all));
}

// One update op per weight-decay group (the GPU updates a group in a few
// multi-tensor launches); each parameter of a group gets exactly the bits an
// op of its own gives it.
TEST_CASE("update ops: one per weight-decay group, each parameter as if alone", "[optim]") {
  using Make = std::function<std::unique_ptr<optim::Optimizer>()>;
  const std::vector<std::pair<std::string, Make>> makers = {
      {"sgd", [] { return optim::make_sgd(0.01); }},
      {"momentum", [] { return optim::make_momentum(0.9, 0.01, true); }},
      {"adamw", [] { return optim::make_adamw(0.9, 0.999, 1e-8, 0.01); }}};
  const std::vector<float> g = {0.5f, -1.f, 0.25f, 2.f};
  for (const auto& [name, make_opt] : makers)
    for (bool no_decay_1d : {false, true}) {
      INFO(name << (no_decay_1d ? ", no decay for 1-D" : ""));
      // Alone: w [4], as make() sets it up.
      auto alone_opt = make_opt();
      alone_opt->set_no_decay_1d(no_decay_1d);
      Setup alone = make(*alone_opt, false);
      step(alone, g);
      step(alone, g);
      // Grouped: a matrix before it and a bias after it.
      auto opt = make_opt();
      opt->set_no_decay_1d(no_decay_1d);
      Setup t;
      t.p.add_var(VarDesc{"a", {2, 3}, DType::f32, true, true, false, {}});
      t.p.add_var(VarDesc{"w", {4}, DType::f32, true, true, false, {}});
      t.p.add_var(VarDesc{"b", {2}, DType::f32, true, true, false, {}});
      for (const char* n : {"a@GRAD", "w@GRAD", "b@GRAD"})
        t.p.add_var(VarDesc{n, {n[0] == 'a' ? 6 : n[0] == 'w' ? 4 : 2}, DType::f32, false, false, true, {}});
      opt->append_update_ops(t.p, {{"a", "a@GRAD"}, {"w", "w@GRAD"}, {"b", "b@GRAD"}}, "");
      std::vector<std::vector<std::string>> groups;
      for (const OpDesc& op : t.p.ops())
        if (op.type == name) groups.push_back(op.ins("Param"));
      if (no_decay_1d)
        CHECK(groups == std::vector<std::vector<std::string>>{{"a"}, {"w", "b"}});
      else
        CHECK(groups == std::vector<std::vector<std::string>>{{"a", "w", "b"}});
      initialize_persistables(t.p, t.s, 1);
      t.s.set("a", Tensor::from_floats({2, 3}, {1.f, 2.f, 3.f, -1.f, -2.f, -3.f}));
      t.s.set("w", Tensor::from_floats({4}, {1.f, -2.f, 0.5f, 3.f}));
      t.s.set("b", Tensor::from_floats({2}, {0.25f, -0.75f}));
      t.s.get(optim::kLearningRate).data<float>()[0] = 0.1f;
      for (int k = 0; k < 2; ++k) {
        t.s.set("a@GRAD", Tensor::from_floats({6}, {0.1f, 0.2f, -0.3f, 0.4f, 0.5f, -0.6f}).reshaped({2, 3}));
        t.s.set("w@GRAD", Tensor::from_floats({4}, g));
        t.s.set("b@GRAD", Tensor::from_floats({2}, {1.f, -1.f}));
        ExecEnv env;
        Executor(t.p, {}).run(t.s, env);
      }
      CHECK(t.s.get("w").to_floats() == alone.s.get("w").to_floats());
      for (auto& v : alone.p.vars())
        if (v.persistable && v.name != optim::kLearningRate) {
          INFO(v.name);
          CHECK(t.s.get(v.name).to_floats() == alone.s.get(v.name).to_floats());
        }
      CHECK(t.s.get("a").to_floats() != std::vector<float>{1.f, 2.f, 3.f, -1.f, -2.f, -3.f});  // the others move too
      CHECK(t.s.get("b").to_floats() != std::vector<float>{0.25f, -0.75f});
    }
}

TEST_CASE("learning-rate schedules", "[optim]") {
  optim::LrSchedule c{optim::Schedule::constant, 0.1, 0, 100};
  CHECK(c.at(0) == 0.1);
  CHECK(c.at(99) == 0.1);
  optim::LrSchedule w{optim::Schedule::constant, 0.1, 10, 100};
  CHECK(w.at(0) == Approx(0.01));
  CHECK(w.at(9) == Approx(0.1));
  optim::LrSchedule cos{optim::Schedule::cosine, 0.1, 0, 100};
  CHECK(cos.at(0) == Approx(0.1));
  CHECK(cos.at(50) == Approx(0.05));
  CHECK(cos.at(100) == Approx(0.0).margin(1e-12));
  CHECK(cos.at(150) == Approx(0.0).margin(1e-12));  // past the end: the final value, not a second rise
  // onecycle against torch.optim.lr_scheduler.OneCycleLR(max_lr=0.1, total_steps=100)
  // (and pct_start=10/57 for the warm-up case), the optimizer's lr before
  // each step, printed by torch 2.x under /usr/bin/python3.
  optim::LrSchedule one{optim::Schedule::onecycle, 0.1, 0, 100};
  const std::pair<int64_t, double> torch_one[] = {{0, 0.0040000000000000036},
                                                  {1, 0.004281378056590748},
                                                  {15, 0.05459866761210004},
                                                  {28, 0.09971862194340926},
                                                  {29, 0.1},
                                                  {30, 0.09994965352845243},
                                                  {60, 0.05892800902855288},
                                                  {98, 5.07464715475788e-05},
                                                  {99, 4e-07}};
  for (auto [step, want] : torch_one) {
    INFO("step " << step);
    CHECK(one.at(step) == Approx(want).epsilon(1e-12));
  }
  for (int64_t s = 1; s < 30; ++s) CHECK(one.at(s) > one.at(s - 1));
  for (int64_t s = 30; s < 100; ++s) CHECK(one.at(s) < one.at(s - 1));
  optim::LrSchedule one_warm{optim::Schedule::onecycle, 0.1, 10, 57};
  const std::pair<int64_t, double> torch_warm[] = {{0, 0.0040000000000000036}, {5, 0.06033511252801266},  {9, 0.1},
                                                   {10, 0.09988834437778195},  {30, 0.05831663446328559}, {56, 4e-07}};
  for (auto [step, want] : torch_warm) {
    INFO("warm-up 10 of 57, step " << step);
    CHECK(one_warm.at(step) == Approx(want).epsilon(1e-12));
  }
  optim::LrSchedule one_short{optim::Schedule::onecycle, 0.1, 1, 3};  // the peak at step 0: no rise to divide by
  CHECK(one_short.at(0) == Approx(0.1));
  CHECK(one_short.at(2) == Approx(4e-07));

  // Warm-up before a cosine decay: linear to the peak over 10 steps, then half a
  // cosine over the remaining 90 (its middle at step 10 + 45).
  optim::LrSchedule wcos{optim::Schedule::cosine, 0.1, 10, 100};
  CHECK(wcos.at(0) == Approx(0.01));
  CHECK(wcos.at(4) == Approx(0.05));
  CHECK(wcos.at(9) == Approx(0.1));
  CHECK(wcos.at(10) == Approx(0.1));
  CHECK(wcos.at(55) == Approx(0.05));
  CHECK(wcos.at(100) == Approx(0.0).margin(1e-12));
  for (int64_t s = 1; s < 10; ++s) CHECK(wcos.at(s) > wcos.at(s - 1));
  for (int64_t s = 11; s <= 100; ++s) CHECK(wcos.at(s) < wcos.at(s - 1));
  // One-cycle with a warm-up: the warm-up replaces pct_start (the peak at step 9, not 29).
  optim::LrSchedule wone{optim::Schedule::onecycle, 0.1, 10, 100};
  CHECK(wone.at(0) == Approx(0.004));
  CHECK(wone.at(9) == Approx(0.1));
  CHECK(wone.at(99) == Approx(0.1 / 25 / 1e4));
  for (int64_t s = 1; s <= 9; ++s) CHECK(wone.at(s) > wone.at(s - 1));
  for (int64_t s = 10; s < 100; ++s) CHECK(wone.at(s) < wone.at(s - 1));
}
