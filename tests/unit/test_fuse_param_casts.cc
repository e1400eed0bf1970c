// amp::fuse_param_casts (amp/fuse_param_casts.h) and its op fused_cast
// (runtime/ops/fused_cast.cc): fused_cast gives the bits of one cast per
// tensor; the pass replaces every forward cast of a weight of the ResNets,
// the Transformer and the MLP with one op placed before any reader, and
// leaves alone what it must; whole AMP training steps give the same bits with
// and without it.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "amp/fuse_param_casts.h"
#include "models/model.h"
#include "runtime/ir/op_registry.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/train_steps.h"

using namespace mix;
using namespace mix::testing;

namespace {

// The forward casts of parameters in `p`, as (parameter, cast variable), in program order.
std::vector<std::pair<std::string, std::string>> param_casts(const Program& p) {
  std::vector<std::pair<std::string, std::string>> r;
  for (const OpDesc& op : p.ops())
    if (op.type == "cast" && op.role == OpRole::forward && p.var(op.in("X")).is_parameter)
      r.emplace_back(op.in("X"), op.out("Out"));
  return r;
}

std::vector<size_t> indices_of(const Program& p, const std::string& type) {
  std::vector<size_t> r;
  for (size_t i = 0; i < p.ops().size(); ++i)
    if (p.ops()[i].type == type) r.push_back(i);
  return r;
}

}  // namespace

TEST_CASE("fused_cast gives the bits of one cast per tensor", "[fuse][amp]") {
  // Overflow to inf, subnormals, NaN, both zeros: every rounding case of cast.
  for (DType from : kFloatTypes)
    for (DType to : kFloatTypes) {
      if (from == to) continue;
      INFO(dname(from) << " -> " << dname(to));
      const std::vector<Shape> shapes = {{65, 33}, {1}, {3, 1, 7}, {0, 4}};
      std::vector<std::pair<std::string, Tensor>> feeds;
      std::vector<std::string> xs, outs;
      std::vector<OpDesc> casts;
      for (size_t i = 0; i < shapes.size(); ++i) {
        std::string x = "x", out = "out";  // appended: GCC 12 warns falsely (-Wrestrict) on "x" + std::to_string(i)
        x += std::to_string(i);
        out += std::to_string(i);
        feeds.push_back({x, with_specials(uniform_tensor(shapes[i], 20 + i, -7e4f, 7e4f), from)});
        xs.push_back(x);
        outs.push_back(out);
        casts.push_back(make_op("cast", {{"X", {x}}}, {{"Out", {out}}}, {{"out_dtype", dname(to)}}));
      }
      const auto fused = run_ops_on({make_op("fused_cast", {{"X", xs}}, {{"Out", outs}}, {{"out_dtype", dname(to)}})},
                                    feeds, cpu_device(), ExecEnv{}, outs);
      const auto apart = run_ops_on(casts, feeds, cpu_device(), ExecEnv{}, outs);
      for (const std::string& out : outs) {
        REQUIRE(fused.at(out).dtype() == to);
        expect_identical(fused.at(out), apart.at(out), "fused_cast " + out);
      }
    }
}

TEST_CASE("fuse_param_casts replaces every forward cast of a weight with one op before their readers", "[fuse][amp]") {
  const std::vector<std::pair<std::string, models::Model>> models = {
      {"resnet-small", narrow_resnet()},
      {"transformer", models::build_transformer({.layers = 2, .d_model = 16, .heads = 2, .context = 8, .vocab = 32})},
      {"mlp", models::build_mlp({.in_features = 12, .hidden = {16, 8}, .num_classes = 4})}};
  for (const auto& [name, model] : models) {
    INFO(name);
    Program p = training_program(model, /*use_amp=*/true);
    const auto before = param_casts(p);
    REQUIRE(before.size() >= 2);  // not vacuous: the model casts several weights
    const size_t ops_before = p.ops().size();
    CHECK(amp::fuse_param_casts(p) == static_cast<int>(before.size()));
    CHECK(param_casts(p).empty());
    const std::vector<size_t> fused = indices_of(p, "fused_cast");
    REQUIRE(fused.size() == 1);
    CHECK(p.ops().size() == ops_before - before.size() + 1);
    const OpDesc& op = p.ops()[fused[0]];
    CHECK(op.role == OpRole::forward);
    CHECK(op.attr<std::string>("out_dtype", "") == "f16");
    // The same parameters and cast variables, in program order; each cast
    // variable still f16 of its parameter's shape, written only here and read
    // only after.
    REQUIRE(op.ins("X").size() == before.size());
    for (size_t i = 0; i < before.size(); ++i) {
      CHECK(op.ins("X")[i] == before[i].first);
      CHECK(op.outs("Out")[i] == before[i].second);
      const VarDesc& v = p.var(before[i].second);
      CHECK(v.dtype == DType::f16);
      CHECK(v.shape == p.var(before[i].first).shape);
      CHECK(p.writer_count(before[i].second) == 1);
      for (const auto& [reader, slot] : p.readers(before[i].second)) CHECK(reader > fused[0]);
    }
    // Run again: nothing left to fuse.
    CHECK(amp::fuse_param_casts(p) == 0);
  }
}

TEST_CASE("fuse_param_casts leaves casts it cannot move", "[fuse][amp]") {
  // w1, w2, w3 are parameters; an op between the casts of w1 and w2 writes
  // w2 (the fused op would read w2 too early), and b is no parameter.
  auto program = [] {
    Program p;
    for (const char* w : {"w1", "w2", "w3"}) {
      VarDesc v = var_desc(w, {4}, DType::f32);
      v.persistable = v.is_parameter = true;
      p.add_var(v);
    }
    p.add_var(var_desc("b", {4}, DType::f32));
    return p;
  };
  auto cast = [](const std::string& x, const std::string& to = "f16") {
    OpDesc c = make_op("cast", {{"X", {x}}}, {{"Out", {x + ".h"}}}, {{"out_dtype", to}});
    c.role = OpRole::forward;
    return c;
  };
  auto types_of = [](const Program& p) {
    std::vector<std::string> types;
    for (const OpDesc& op : p.ops()) types.push_back(op.type);
    return types;
  };
  {
    // A write through a view of w2 is a write of w2, which its name never shows.
    Program v = program();
    v.append_op(cast("w1"));
    v.append_op(make_op("reshape2", {{"X", {"w2"}}}, {{"Out", {"w2v"}}}, {{"shape", std::vector<int64_t>{2, 2}}}));
    v.append_op(make_op("scale", {{"X", {"w2v"}}}, {{"Out", {"w2v"}}}, {{"scale", 2.0}}));
    v.append_op(cast("w2"));
    CHECK(amp::fuse_param_casts(v) == 0);
    CHECK(types_of(v) == std::vector<std::string>{"cast", "reshape2", "scale", "cast"});
  }
  Program p = program();
  p.append_op(cast("w1"));
  p.append_op(make_op("scale", {{"X", {"b"}}}, {{"Out", {"w2"}}}, {{"scale", 2.0}}));
  p.append_op(cast("w2"));
  p.append_op(cast("b"));
  p.append_op(cast("w3"));
  CHECK(amp::fuse_param_casts(p) == 2);
  CHECK(types_of(p) == std::vector<std::string>{"fused_cast", "scale", "cast", "cast"});
  CHECK(p.ops()[0].ins("X") == std::vector<std::string>{"w1", "w3"});
  CHECK(p.ops()[2].in("X") == "w2");
  CHECK(p.ops()[3].in("X") == "b");
  // One cast alone is left as it is.
  Program one;
  VarDesc w = var_desc("w", {2}, DType::f32);
  w.persistable = w.is_parameter = true;
  one.add_var(w);
  one.append_op(cast("w"));
  CHECK(amp::fuse_param_casts(one) == 0);
  CHECK(one.ops()[0].type == "cast");

  // A cast outside the forward pass belongs to another part of the step
  // (evaluation runs the forward ops alone); the fused op is a forward one.
  Program roles = program();
  roles.append_op(cast("w1"));
  roles.append_op(cast("w2"));
  OpDesc late = cast("w3");
  late.role = OpRole::optimize;
  roles.append_op(late);
  CHECK(amp::fuse_param_casts(roles) == 2);
  REQUIRE(types_of(roles) == std::vector<std::string>{"fused_cast", "cast"});
  CHECK(roles.ops()[0].ins("X") == std::vector<std::string>{"w1", "w2"});
  CHECK(roles.ops()[1].role == OpRole::optimize);

  // A cast to the parameter's own dtype is a copy, not the half copy the
  // pass is for.
  Program same = program();
  same.append_op(cast("w1", "f32"));
  same.append_op(cast("w2", "f32"));
  CHECK(amp::fuse_param_casts(same) == 0);
  CHECK(types_of(same) == std::vector<std::string>{"cast", "cast"});

  // Another op writes w2's cast variable between the first cast and w2's:
  // the fused op would write it before that op, whose value readers would
  // then see instead of the cast's.
  Program written = program();
  written.append_op(cast("w1"));
  written.append_op(make_op("cast", {{"X", {"b"}}}, {{"Out", {"w2.h"}}}, {{"out_dtype", std::string("f16")}}));
  written.append_op(cast("w2"));
  written.append_op(cast("w3"));
  CHECK(amp::fuse_param_casts(written) == 2);
  REQUIRE(types_of(written) == std::vector<std::string>{"fused_cast", "cast", "cast"});
  CHECK(written.ops()[0].ins("X") == std::vector<std::string>{"w1", "w3"});
  CHECK(written.ops()[2].in("X") == "w2");
}

TEST_CASE("AMP training with fused weight casts gives the bits of training without", "[fuse][amp]") {
  for (bool channels_last : {false, true}) {
    INFO((channels_last ? "NHWC" : "NCHW"));
    // fuse_matmul_bias off in both: under AMP it fuses the classifier's mul
    // and bias add only once their bias's cast has left them (a fused_cast),
    // and the fused op rounds once fewer, so it would tell the runs apart.
    TrainOptions o{.amp = true, .fuse_matmul_bias = false, .steps = 3, .batch = 4};
    TrainedModel fused = train_steps(narrow_resnet(channels_last), o);
    o.fuse_param_casts = false;
    TrainedModel apart = train_steps(narrow_resnet(channels_last), o);
    CHECK(indices_of(fused.model.program, "fused_cast").size() == 1);
    CHECK(indices_of(apart.model.program, "fused_cast").empty());
    for (const TrainedModel* run : {&fused, &apart})
      for (float f : run->found_inf) REQUIRE(f == 0.f);  // every AMP step was applied
    expect_same_training(fused, apart);
  }
}
