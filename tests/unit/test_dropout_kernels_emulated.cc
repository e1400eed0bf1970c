// dropout's CUDA kernels (runtime/ops/cuda/dropout_kernels.cuh), their very
// source, run on the CPU (tests/unit/cuda_emulation.h) and launched as
// dropout.cu launches them, against the CPU's dropout and dropout_grad: Out
// and Mask bit for bit (the same hash of the same key, one multiply by the same
// float), with the key made on the host and, as in a recorded step, on the
// device from the step in device memory; Mask not wanted; and X@GRAD bit for
// bit. test_cuda_transformer_ops checks the GPU itself where one is lent.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/ir/op_context.h"
#include "runtime/ir/scope.h"
#include "runtime/ops/dropout_attrs.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"

// The emulation and its map launches, then the kernels (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"

#include "runtime/ops/cuda/dropout_kernels.cuh"

using namespace mix;
using namespace mix::testing;
namespace cu = mix::cuda;

namespace {

constexpr double kProb = 0.3;
constexpr int64_t kSeed = 77;

// The step, rank and micro-batch the ops run in: each enters the key.
ExecEnv run_env() {
  ExecEnv env;
  env.step = 12;
  env.rank = 3;
  env.micro_batch = 1;
  return env;
}

OpDesc dropout_op() {
  return make_op("dropout", {{"X", {"x"}}}, {{"Out", {"out"}}, {"Mask", {"mask"}}},
                 {{"dropout_prob", kProb}, {"seed", kSeed}});
}

// What the launcher takes from the op: the key's parts, and the key for env's step.
struct Key {
  dropout_rules::MaskKeyParts parts;
  uint64_t host;
};
Key key_of(const OpDesc& op, ExecEnv env) {
  Scope scope;
  const OpContext ctx(op, scope, env);
  return {dropout_rules::mask_key_parts(ctx), dropout_rules::mask_key(ctx, env.step)};
}

template <typename T>
void check_dtype(DType dt) {
  const Shape shape{37, 129};  // odd sizes: the grid's last block part-full
  const auto n = static_cast<size_t>(shape_numel(shape));
  const Tensor x = random_tensor(shape, dt, 701, -2.f, 2.f);
  const ExecEnv env = run_env();
  const auto cpu = run_ops_on({dropout_op()}, {{"x", x}}, cpu_device(), env, {"out", "mask"});
  const std::vector<T> want_out = values_of<T>(cpu.at("out"));
  const std::vector<uint8_t> want_mask = values_of<uint8_t>(cpu.at("mask"));
  size_t kept = 0;
  for (uint8_t m : want_mask) kept += m;
  CHECK(kept > 0);  // both kinds of element, so the comparison sees both
  CHECK(kept < n);

  const Key key = key_of(dropout_op(), env);
  const auto p = static_cast<float>(kProb);
  const fn::DropoutApply f{fn::dropout_scale(p)};
  const std::vector<T> xv = values_of<T>(x);
  for (bool key_on_device : {false, true})
    for (bool want_mask_out : {true, false}) {
      const std::string what = dname(dt) + (key_on_device ? ", key made on the device" : ", key from the host") +
                               (want_mask_out ? "" : ", Mask not wanted");
      INFO(what);
      uint64_t device_key = 0;
      if (key_on_device) {
        const int64_t step = env.step;  // ExecEnv::device_step's value
        emulated_grid_stride(
            1, cu::DropoutMaskKeyOnDevice{&step, key.parts.seed, key.parts.rank, key.parts.name_hash, &device_key});
        CHECK(device_key == key.host);
      }
      std::vector<T> out(n, from_float<T>(NAN));
      std::vector<uint8_t> mask(n, 7);
      emulated_grid_stride(
          static_cast<int64_t>(n),
          cu::DropoutForward<T>{xv.data(), out.data(), want_mask_out ? mask.data() : nullptr,
                                key_on_device ? 0 : key.host, key_on_device ? &device_key : nullptr, p, f});
      expect_same_bits(out, want_out, what + ": Out");
      if (want_mask_out) expect_same_bits(mask, want_mask, what + ": Mask");
      if (!want_mask_out) CHECK(mask == std::vector<uint8_t>(n, 7));  // untouched
    }

  // The gradient through the CPU's Mask.
  const Tensor dout = random_tensor(shape, dt, 702, -1.f, 1.f);
  const auto cpu_grad = run_ops_on({make_op("dropout_grad", {{"Mask", {"mask"}}, {"Out@GRAD", {"dout"}}},
                                            {{"X@GRAD", {"dx"}}}, {{"dropout_prob", kProb}, {"seed", kSeed}})},
                                   {{"mask", cpu.at("mask")}, {"dout", dout}}, cpu_device(), env, {"dx"});
  const std::vector<T> doutv = values_of<T>(dout);
  std::vector<T> dx(n, from_float<T>(NAN));
  emulated_grid_stride(static_cast<int64_t>(n), cu::DropoutBackward<T>{doutv.data(), want_mask.data(), dx.data(), f});
  expect_same_bits(dx, values_of<T>(cpu_grad.at("dx")), dname(dt) + ": X@GRAD");
}

}  // namespace

TEST_CASE("emulated dropout gives the CPU's Out, Mask and X@GRAD bit for bit", "[emulated][dropout]") {
  check_dtype<float>(DType::f32);
  check_dtype<half_t>(DType::f16);
  check_dtype<bf16_t>(DType::bf16);
}

TEST_CASE("dropout's key differs with the step, the rank and the micro-batch", "[emulated][dropout]") {
  // Not vacuous: the device-made key above matches the host's for one env
  // only if it reads the step; here each part moves the key.
  const OpDesc op = dropout_op();
  const ExecEnv base = run_env();
  const uint64_t k = key_of(op, base).host;
  ExecEnv other = base;
  other.step += 1;
  CHECK(key_of(op, other).host != k);
  other = base;
  other.rank += 1;
  CHECK(key_of(op, other).host != k);
  other = base;
  other.micro_batch += 1;
  CHECK(key_of(op, other).host != k);
  uint64_t device_key = 0;
  const int64_t next_step = base.step + 1;
  const Key parts = key_of(op, base);
  emulated_grid_stride(1, cu::DropoutMaskKeyOnDevice{&next_step, parts.parts.seed, parts.parts.rank,
                                                     parts.parts.name_hash, &device_key});
  CHECK(device_key != k);
  ExecEnv next = base;
  next.step = next_step;
  CHECK(device_key == key_of(op, next).host);
}
