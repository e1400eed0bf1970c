// Whole-model parity of the GPT-style Transformer (models/transformer.cc) with
// PyTorch: the loss, every parameter gradient and the logits of one training
// step must match what torch computes from the same initial state_dict and batch
// (tests/python/transformer_reference.py, a nanoGPT-style model written from
// torch.nn modules with the same module names, run at test time with
// /usr/bin/python3; tolerances and the comparison in tests/unit/parity.h). Two
// 2-layer models: one with its own lm_head, one with tied embedding and output
// weights (the tied wte's gradient is the sum of the lookup's and the output
// layer's). No dropout. Each check runs our model twice: with its
// fused_attention op (the default) and with the unfused matmul, softmax, matmul
// (--no-fused-attention); the fused model is also checked against a reference
// whose attention is torch's scaled_dot_product_attention. AMP: the loss and
// the master gradients within FP16 tolerance of torch's FP32. And the
// state_dict names and shapes of the default configuration.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/exec/executor.h"
#include "runtime/exec/init.h"
#include "runtime/optim/optimizer.h"
#include "tests/unit/parity.h"

using namespace mix;
using mix::testing::Tol;
using mix::testing::check_close;

namespace {

using Net = mix::testing::ReferenceNet;  // args: transformer_reference.py arguments

const Net kUntied{"2-layer Transformer with lm_head",
                  "--layers 2 --d-model 32 --heads 4 --context 16 --vocab 64 --batch 3 --seed 0"};
const Net kTied{"2-layer Transformer with tied embedding and output weights",
                "--layers 2 --d-model 32 --heads 4 --context 16 --vocab 64 --batch 3 --seed 1 --tie-weights"};
const Net kSdpa{"2-layer Transformer with lm_head, torch's attention through scaled_dot_product_attention",
                "--layers 2 --d-model 32 --heads 4 --context 16 --vocab 64 --batch 3 --seed 2 --sdpa"};

// The two ways the model builds its attention.
enum class Attention { fused, unfused };
const char* attention_name(Attention a) { return a == Attention::fused ? "fused_attention" : "--no-fused-attention"; }

const io::SafetensorsFile& reference(const Net& net) {
  return mix::testing::cached_reference("transformer_reference.py", net.args);
}

const Tensor& get(const io::SafetensorsFile& f, const std::string& name) {
  return mix::testing::reference_tensor(f, name);
}

int count_prefixed(const io::SafetensorsFile& f, const std::string& prefix) {
  int n = 0;
  for (auto& [name, t] : f.tensors) n += name.rfind(prefix, 0) == 0;
  return n;
}

// Our Transformer with the reference's configuration and initial state, one SGD
// step's program (lr 0: only the loss, the logits and the gradients are computed).
struct Run {
  models::Model model;
  launch::TrainProgram train;
  Scope scope;

  Run(const io::SafetensorsFile& ref, bool amp, Attention attention) {
    auto meta = [&](const char* k) { return ref.metadata.at(k); };
    models::TransformerConfig c;
    c.layers = std::stoll(meta("layers"));
    c.d_model = std::stoll(meta("d_model"));
    c.heads = std::stoll(meta("heads"));
    c.context = std::stoll(meta("context"));
    c.vocab = std::stoll(meta("vocab"));
    c.tie_weights = meta("tie_weights") == "1";
    c.dropout = 0;
    c.fused_attention = attention == Attention::fused;
    model = models::build_transformer(c, "transformer");
    launch::TrainProgramOptions o;  // AMP's defaults: Paddle lists, dynamic scale 32768, FP16
    o.precision = amp ? mix::amp::Precision::amp : mix::amp::Precision::fp32;
    o.optimizer.kind = optim::OptimizerKind::sgd;
    o.passes = launch::StepPasses::none();
    train = launch::build_train_program(model.program, model.loss, o);
    initialize_persistables(model.program, scope, 1);
    mix::testing::load_reference_state(ref, model.program, scope);
    scope.get(optim::kLearningRate).data<float>()[0] = 0.f;
  }

  float step(const io::SafetensorsFile& ref) {
    return mix::testing::run_reference_step(ref, model, train, scope, {model.logits});
  }
};

Tensor scalar(float v) { return Tensor::from_floats({1}, {v}); }

// ---- tolerances (FP32 against FP32: see parity.h and test_mlp_parity.cc) -----------
// Both sides compute in FP32 (u = 2^-24 = 6e-8) from the same inputs but sum in
// different orders (OpenBLAS and our row kernels against ATen), so a K-term sum
// differs by ~u sqrt(K) of its terms' size (K <= 4d = 128 in a GEMM, B T = 48
// rows in a weight gradient, 64 classes in the softmax), compounded over a few
// layers: ~1e-6 of the terms at most. Observed (MIX_PARITY_VERBOSE=1) in the
// comment of each constant, as the worst fraction of its tolerance over both
// models and both references (torch FP32 and float64).
//
// The loss is ~ln(64) = 4.2 at init; 1e-5 relative is ~30x what two layers of
// FP32 leave and far below what a wrong formula changes (an unmasked future
// token, a missing 1/sqrt(hd), a wrong mean: 1e-3 .. 1e-1). Observed: 0.011.
constexpr Tol kLossTol{1e-6, 0, 1e-5};
// Gradients: layer_norm's backward subtracts row means of products, attention's
// softmax backward subtracts sum(p dp), and weight gradients sum B T terms of
// either sign: elements that cancel keep an error relative to the size of the
// tensor's terms, not their own size, hence 5e-6 (~80 u) of the tensor's largest
// |grad| plus 5e-5 relative. A transposed, mis-scaled or mis-masked gradient, or
// a layer_norm epsilon other than 1e-5 (the residual stream's variance at init is
// only ~1e-3), is off by 1e-2 of max|grad| or more. Observed: 0.057.
constexpr Tol kGradTol{1e-9, 5e-6, 5e-5};
// Logits up to ~0.6 (ln_f's unit-variance rows times N(0, 0.02) weights, K = d =
// 32): the forward only, ~u sqrt(K) per GEMM over three GEMM levels; 2e-6 (~30 u)
// of max|logit| plus 2e-6 relative. Observed: 0.093.
constexpr Tol kLogitTol{1e-8, 2e-6, 2e-6};

// ---- AMP against torch FP32 ----------------------------------------------------------
// The AMP program (default lists) runs every matmul in FP16, its inputs, weights
// and outputs rounded to u16 = 2^-11 = 4.9e-4, together with the gray ops between
// matmuls (bias adds, split, reshape2, transpose2, gelu); the residual stream,
// lookup_table, layer_norm, softmax and the loss stay FP32.
//
// Logits: FP16 h . FP16 W^T rounded to FP16: ~1.5 u16 of max|logit| (two input
// roundings averaging over K = 32 terms, one output rounding of <= u16/2 relative,
// and the FP16 errors the blocks pass on, damped by ln_f). 2e-3 (4 u16) of
// max|logit| plus 2e-3 relative. Observed: 0.20.
constexpr Tol kAmpLogitTol{1e-7, 2e-3, 2e-3};
// Loss: each token's lse(z) - z_label moves by at most 2 max|dz| (~4e-4 from the
// logit errors above, ~7e-4 with the whole logit tolerance), and the mean over
// B T = 48 tokens averages independent errors (/ sqrt(48) ~ 1e-4). 1e-4 absolute
// plus 1e-5 relative (~1.4e-4 on ln 64); a loss left scaled by the loss scale, or
// computed from wrongly cast logits, is far outside. Observed: 0.044.
constexpr Tol kAmpLossTol{1e-4, 0, 1e-5};
// Master gradients: a Transformer at init (pre-norm, small residual branches)
// amplifies FP16 roundings only mildly, so each gradient is held elementwise. A
// weight gradient is a sum over B T = 48 tokens of products of two FP16-rounded
// factors, each carrying the FP16 errors of a few GEMMs upstream (~u16 each), so
// its error is a few u16 of the size of its terms: 5e-3 (10 u16) of the tensor's
// largest |grad| (elements that cancel) plus 5e-3 relative. What it catches: a
// gradient left scaled by the loss scale (x32768), a parameter or master
// gradient kept in FP16 or cast wrongly, a missing or doubled contribution (the
// tied wte gets two), each off by O(|g|). Observed: 0.16 (worst ~1.6 u16 of max|g|).
constexpr Tol kAmpGradTol{1e-7, 5e-3, 5e-3};

void check_fp32_parity(const Net& net, Attention attention) {
  INFO(net.label << ", " << attention_name(attention));
  const io::SafetensorsFile& ref = reference(net);
  Run run(ref, false, attention);
  const float loss = run.step(ref);
  check_close("loss vs torch", scalar(loss), get(ref, "loss"), kLossTol);
  check_close("loss vs float64", scalar(loss), get(ref, "loss64"), kLossTol);
  // Every parameter has a gradient, and a reference gradient, and the other way round.
  REQUIRE(run.train.param_grads.size() == run.model.program.parameters().size());
  CHECK(static_cast<int>(run.train.param_grads.size()) == count_prefixed(ref, "grad."));
  for (auto& [param, grad] : run.train.param_grads) {
    check_close("gradient of " + param + " vs torch", run.scope.get(grad), get(ref, "grad." + param), kGradTol);
    check_close("gradient of " + param + " vs float64", run.scope.get(grad), get(ref, "grad64." + param), kGradTol);
  }
  check_close("logits vs torch", run.scope.get(run.model.logits), get(ref, "logits"), kLogitTol);
  check_close("logits vs float64", run.scope.get(run.model.logits), get(ref, "logits64"), kLogitTol);
}

}  // namespace

TEST_CASE("Transformer parity with PyTorch: 2 layers with lm_head, FP32", "[transformer][parity]") {
  for (Attention a : {Attention::fused, Attention::unfused}) check_fp32_parity(kUntied, a);
}

TEST_CASE("Transformer parity with PyTorch's scaled_dot_product_attention: fused_attention, FP32",
          "[transformer][parity][fused_attention]") {
  REQUIRE(reference(kSdpa).metadata.at("attention") == "sdpa");
  check_fp32_parity(kSdpa, Attention::fused);
}

TEST_CASE("Transformer parity with PyTorch: tied embedding and output weights, FP32", "[transformer][parity]") {
  for (Attention a : {Attention::fused, Attention::unfused}) check_fp32_parity(kTied, a);
  // The tied model has no lm_head: the one matrix gets both gradients.
  const io::SafetensorsFile& ref = reference(kTied);
  CHECK(ref.find("init.lm_head.weight") == nullptr);
  CHECK(ref.find("grad.transformer.wte.weight") != nullptr);
}

TEST_CASE("Transformer parity with PyTorch: AMP loss and master gradients within FP16 tolerance",
          "[transformer][parity][amp]") {
  for (const Net* net : {&kUntied, &kTied})
    for (Attention attention : {Attention::fused, Attention::unfused}) {
      INFO(net->label << ", " << attention_name(attention));
      const io::SafetensorsFile& ref = reference(*net);
      Run run(ref, true, attention);
      const float loss = run.step(ref);
      REQUIRE(!run.train.found_inf.empty());
      REQUIRE(run.scope.get(run.train.found_inf).item_float() == 0.f);  // no overflow: the step was not skipped
      check_close("AMP loss vs torch FP32", scalar(loss), get(ref, "loss"), kAmpLossTol);
      // The AMP program really ran in FP16: the output layer's matmul made FP16
      // logits, and the loss is not bit-identical to the FP32 program's.
      const Tensor& logits = run.scope.get(run.model.logits);
      CHECK(logits.dtype() == DType::f16);
      check_close("AMP logits vs torch FP32", logits, get(ref, "logits"), kAmpLogitTol);
      Run fp32(ref, false, attention);
      const float fp32_loss = fp32.step(ref);
      INFO("AMP loss " << loss << ", FP32 loss " << fp32_loss);
      CHECK(loss != fp32_loss);
      REQUIRE(run.train.param_grads.size() == run.model.program.parameters().size());
      CHECK(static_cast<int>(run.train.param_grads.size()) == count_prefixed(ref, "grad."));
      for (auto& [param, grad] : run.train.param_grads) {
        const Tensor& g = run.scope.get(grad);
        CHECK(g.dtype() == DType::f32);  // the master gradient, unscaled
        check_close("AMP master gradient of " + param + " vs torch FP32", g, get(ref, "grad." + param), kAmpGradTol);
      }
    }
}

TEST_CASE("Transformer: a step with fused_attention and with --no-fused-attention gives the same loss",
          "[transformer][fused_attention]") {
  const io::SafetensorsFile& ref = reference(kUntied);
  const int64_t context = std::stoll(ref.metadata.at("context"));
  for (bool amp : {false, true}) {
    INFO((amp ? "AMP" : "FP32"));
    Run fused(ref, amp, Attention::fused), unfused(ref, amp, Attention::unfused);
    const float fused_loss = fused.step(ref), unfused_loss = unfused.step(ref);
    // FP32: the two differ only in the order of FP32 sums (SGEMM blocks
    // against the fused op's tiles), ~1e-7 of the loss; 1e-6 relative is
    // still far below a masking or scaling mistake (1e-3 or more). AMP: the
    // unfused ops also round the scores and probabilities to FP16, which
    // moves the loss by the AMP tolerance against torch at most (kAmpLossTol).
    check_close("loss, fused_attention vs --no-fused-attention", scalar(fused_loss), scalar(unfused_loss),
                amp ? kAmpLossTol : Tol{1e-7, 0, 1e-6});
    REQUIRE(fused.train.param_grads.size() == unfused.train.param_grads.size());
    for (size_t i = 0; i < fused.train.param_grads.size(); ++i) {
      const auto& [param, grad] = fused.train.param_grads[i];
      REQUIRE(unfused.train.param_grads[i].first == param);  // the same parameters, built in the same order
      check_close("gradient of " + param + ", fused_attention vs --no-fused-attention", fused.scope.get(grad),
                  unfused.scope.get(unfused.train.param_grads[i].second), amp ? kAmpGradTol : kGradTol);
    }
    // The fused program never declares a [.., T, T] tensor (the probabilities);
    // the unfused one does, in each layer.
    auto square_vars = [&](const Program& p) {
      int n = 0;
      for (const VarDesc& v : p.vars())
        n += v.shape.size() >= 2 && v.shape[v.shape.size() - 1] == context && v.shape[v.shape.size() - 2] == context;
      return n;
    };
    CHECK(square_vars(fused.model.program) == 0);
    CHECK(square_vars(unfused.model.program) > 0);
  }
}

TEST_CASE("Transformer: nanoGPT's state_dict names and shapes", "[transformer]") {
  // The default configuration: layers 4, d_model 128, heads 4, context 128, vocab 256.
  const models::TransformerConfig c;
  REQUIRE(c.layers == 4);
  REQUIRE(c.d_model == 128);
  REQUIRE(c.context == 128);
  REQUIRE(c.vocab == 256);
  models::Model m = models::build_transformer(c);
  std::map<std::string, Shape> shapes;
  int64_t params = 0;
  for (const VarDesc& v : m.program.vars()) {
    if (v.is_parameter || v.is_buffer) shapes[v.name] = v.shape;
    if (v.is_parameter) params += shape_numel(v.shape);
  }
  // Per block (d = 128): ln_1 2d + c_attn (3d d + 3d) + c_proj (d d + d) + ln_2 2d
  // + c_fc (4d d + 4d) + mlp.c_proj (4d d + d) = 12 d^2 + 13 d = 198,272; four blocks
  // 793,088; wte 256 x 128 = 32,768; wpe 128 x 128 = 16,384; ln_f 256; lm_head
  // 256 x 128 = 32,768: 875,264 (nanoGPT's GPT(...).parameters(), untied).
  CHECK(params == 875264);
  CHECK(shapes.size() == 53);  // wte, wpe, 12 per block, ln_f's 2, lm_head
  CHECK(shapes.at("transformer.wte.weight") == Shape{256, 128});
  CHECK(shapes.at("transformer.wpe.weight") == Shape{128, 128});
  CHECK(shapes.at("transformer.h.0.ln_1.weight") == Shape{128});
  CHECK(shapes.at("transformer.h.0.attn.c_attn.weight") == Shape{384, 128});
  CHECK(shapes.at("transformer.h.1.attn.c_attn.bias") == Shape{384});
  CHECK(shapes.at("transformer.h.2.attn.c_proj.weight") == Shape{128, 128});
  CHECK(shapes.at("transformer.h.3.ln_2.bias") == Shape{128});
  CHECK(shapes.at("transformer.h.3.mlp.c_fc.weight") == Shape{512, 128});
  CHECK(shapes.at("transformer.h.3.mlp.c_proj.weight") == Shape{128, 512});
  CHECK(shapes.at("transformer.h.3.mlp.c_proj.bias") == Shape{128});
  CHECK(shapes.at("transformer.ln_f.bias") == Shape{128});
  CHECK(shapes.at("lm_head.weight") == Shape{256, 128});
  CHECK(shapes.count("transformer.h.4.ln_1.weight") == 0);

  models::TransformerConfig tied = c;
  tied.tie_weights = true;
  models::Model t = models::build_transformer(tied);
  int64_t tied_params = 0;
  std::set<std::string> names;
  for (const std::string& name : t.program.parameters()) {
    tied_params += shape_numel(t.program.var(name).shape);
    names.insert(name);
  }
  CHECK(names.count("lm_head.weight") == 0);
  CHECK(names.count("transformer.wte.weight") == 1);
  CHECK(names.size() == 52);
  CHECK(tied_params == 875264 - 32768);  // 842,496: the output layer reuses wte
}

TEST_CASE("Transformer: nanoGPT's initialisation", "[transformer]") {
  // nanoGPT's GPT._init_weights: every Linear and Embedding weight N(0, 0.02),
  // then the two residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02 /
  // sqrt(2 n_layer)); biases 0, layer norm weights 1. The parity tests load
  // torch's initial state, so only this test sees ours.
  for (int64_t layers : {1, 4}) {
    models::TransformerConfig c;
    c.layers = layers;
    const models::Model m = models::build_transformer(c);
    for (const std::string& name : m.program.parameters()) {
      INFO(name << " with " << layers << " layers");
      const VarDesc& v = m.program.var(name);
      const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      if (bias) {
        CHECK(v.init.kind == VarInit::Kind::zeros);
      } else if (name.find(".ln_") != std::string::npos) {
        CHECK((v.init.kind == VarInit::Kind::constant && v.init.a == 1.0));
      } else {
        CHECK(v.init.kind == VarInit::Kind::normal);
        const bool residual = name.find("c_proj") != std::string::npos;
        CHECK(v.init.a == Approx(residual ? 0.02 / std::sqrt(2.0 * static_cast<double>(layers)) : 0.02));
      }
    }
  }
}
