// --model gpt2 (models::transformer_preset(gpt2), models/transformer.cc): GPT-2
// small's shapes and parameter count as nanoGPT has them, and the padded
// vocabulary against PyTorch. A small GPT-2-shaped model (2 layers, d_model 64,
// 4 heads, context 32, vocabulary 100 padded to 128, tied embeddings, biases)
// is checked against tests/python/transformer_reference.py's nanoGPT GPT with
// the UNPADDED vocabulary of 100 (--tie-weights --sdpa): loss, every gradient
// and the logits of one step must match, the padding rows of wte must get a
// gradient of exactly 0, and the model starts from the state_dict torch wrote
// (100-row wte) through --init-from's loader. Also the padding's
// initialisation and an AdamW step that leaves it at zero; the masking ops
// alone are tested in test_ops.cc (tests/unit/padded_classes_check.h).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/exec/executor.h"
#include "runtime/exec/init.h"
#include "runtime/io/checkpoint.h"
#include "runtime/io/safetensors.h"
#include "runtime/optim/optimizer.h"
#include "tests/unit/padded_classes_check.h"
#include "tests/unit/parity.h"

using namespace mix;
using mix::testing::check_close;
using mix::testing::column_range;
using mix::testing::Tol;
using mix::testing::uniform_tensor;

namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 100, kPaddedVocab = 128;

// Where the reference writes torch's initial state_dict, once per process.
const std::string& state_dict_path() {
  static const struct Path {
    std::string path =
        (fs::temp_directory_path() / ("mix_gpt2_state_" + std::to_string(getpid()) + ".safetensors")).string();
    ~Path() { fs::remove(path); }
  } p;
  return p.path;
}

const io::SafetensorsFile& reference() {
  const std::string args = "--layers 2 --d-model 64 --heads 4 --context 32 --vocab " + std::to_string(kVocab) +
                           " --batch 2 --seed 4 --tie-weights --sdpa --state-dict '" + state_dict_path() + "'";
  return mix::testing::cached_reference("transformer_reference.py", args);
}

const Tensor& get(const std::string& name) { return mix::testing::reference_tensor(reference(), name); }

// The GPT-2 preset cut down to the reference's size; the vocabulary padded to a multiple of 64.
models::TransformerConfig small_gpt2() {
  models::TransformerConfig c = models::transformer_preset(models::TransformerPreset::gpt2);
  c.layers = 2;
  c.d_model = 64;
  c.heads = 4;
  c.context = 32;
  c.vocab = kVocab;
  return c;
}

// The small GPT-2 started from torch's state_dict file through --init-from's
// loader, one step's program (lr 0 unless `optimizer` says otherwise).
struct Run {
  models::Model model;
  launch::TrainProgram train;
  Scope scope;

  explicit Run(bool amp, optim::OptimizerKind optimizer = optim::OptimizerKind::sgd, float lr = 0.f) {
    reference();  // writes the state_dict file
    model = models::build_transformer(small_gpt2(), "gpt2");
    launch::TrainProgramOptions o;
    o.precision = amp ? mix::amp::Precision::amp : mix::amp::Precision::fp32;
    o.optimizer.kind = optimizer;
    o.passes = launch::StepPasses::none();
    train = launch::build_train_program(model.program, model.loss, o);
    initialize_persistables(model.program, scope, 1);
    int ignored = -1;
    const int loaded = io::load_parameters(state_dict_path(), model.program, scope, &ignored);
    CHECK(loaded == static_cast<int>(model.program.parameters().size()));
    CHECK(ignored == 0);  // torch's state_dict holds exactly our parameters
    scope.get(optim::kLearningRate).data<float>()[0] = lr;
  }

  float step() { return mix::testing::run_reference_step(reference(), model, train, scope, {model.logits}); }

  const Tensor& grad_of(const std::string& param) const {
    std::string grad;
    for (auto& [p, g] : train.param_grads)
      if (p == param) grad = g;
    INFO("the gradient of " << param);
    REQUIRE(!grad.empty());
    return scope.get(grad);
  }
};

Tensor scalar(float v) { return Tensor::from_floats({1}, {v}); }

// Rows [from, to) of a 2-D tensor.
Tensor row_range(const Tensor& t, int64_t from, int64_t to) {
  const int64_t cols = t.dim(1);
  const std::vector<float> v = t.to_floats();
  return Tensor::from_floats({to - from, cols}, std::vector<float>(v.begin() + from * cols, v.begin() + to * cols));
}

// Tolerances: test_transformer_parity.cc explains each for the 2-layer, d_model
// 32 model; here d_model is 64 (GEMM sums up to 4d = 256 terms, B T = 64
// tokens), which adds ~sqrt(2) to the FP32 errors, so the same bars hold with
// room (MIX_PARITY_VERBOSE=1 prints the worst fraction of each tolerance used).
constexpr Tol kLossTol{1e-6, 0, 1e-5};
constexpr Tol kGradTol{1e-9, 5e-6, 5e-5};
constexpr Tol kLogitTol{1e-8, 2e-6, 2e-6};
constexpr Tol kAmpLossTol{1e-4, 0, 1e-5};
constexpr Tol kAmpGradTol{1e-7, 5e-3, 5e-3};

}  // namespace

TEST_CASE("GPT-2 preset: nanoGPT's GPT-2 small, shapes and 124M parameters", "[gpt2]") {
  const models::TransformerConfig c = models::transformer_preset(models::TransformerPreset::gpt2);
  CHECK(c.layers == 12);
  CHECK(c.d_model == 768);
  CHECK(c.heads == 12);
  CHECK(c.context == 1024);
  CHECK(c.vocab == 50257);
  CHECK(c.padded_vocab() == 50304);
  CHECK(c.tie_weights);
  const models::Model m = models::build_transformer(c, "gpt2");
  std::map<std::string, Shape> shapes;
  int64_t params = 0;
  for (const std::string& name : m.program.parameters()) {
    shapes[name] = m.program.var(name).shape;
    params += shape_numel(m.program.var(name).shape);
  }
  CHECK(shapes.size() == 148);  // wte, wpe, 12 per block, ln_f's 2; no lm_head
  CHECK(shapes.count("lm_head.weight") == 0);
  CHECK(shapes.at("transformer.wte.weight") == Shape{50304, 768});
  CHECK(m.program.var("transformer.wte.weight").unpadded_rows == 50257);
  CHECK(shapes.at("transformer.wpe.weight") == Shape{1024, 768});
  CHECK(shapes.at("transformer.h.0.ln_1.weight") == Shape{768});
  CHECK(shapes.at("transformer.h.0.attn.c_attn.weight") == Shape{2304, 768});
  CHECK(shapes.at("transformer.h.0.attn.c_attn.bias") == Shape{2304});
  CHECK(shapes.at("transformer.h.5.attn.c_proj.weight") == Shape{768, 768});
  CHECK(shapes.at("transformer.h.11.ln_2.bias") == Shape{768});
  CHECK(shapes.at("transformer.h.11.mlp.c_fc.weight") == Shape{3072, 768});
  CHECK(shapes.at("transformer.h.11.mlp.c_proj.weight") == Shape{768, 3072});
  CHECK(shapes.at("transformer.ln_f.bias") == Shape{768});
  CHECK(shapes.count("transformer.h.12.ln_1.weight") == 0);
  // Per block 12 d^2 + 13 d = 7,087,872; 12 blocks 85,054,464; wte 50,257 x 768
  // = 38,597,376; wpe 786,432; ln_f 1,536: 124,439,808, the 124.44M of GPT-2
  // small with tied embeddings. nanoGPT's GPT prints get_num_params(), which
  // leaves out wpe: "number of parameters: 123.65M". Padded, wte has 47 more rows.
  const int64_t padding = (50304 - 50257) * 768;
  CHECK(params - padding == 124439808);
  CHECK(params - padding - 1024 * 768 == 123653376);
  CHECK(params == 124475904);
  CHECK(m.num_classes == 50257);
  CHECK(m.program.var(m.logits).shape == Shape{-1, 1024, 50304});
  // The loss masks the 47 padding logits.
  bool masked = false;
  for (const OpDesc& op : m.program.ops())
    if (op.type == "softmax_with_cross_entropy") masked = op.attr<int64_t>("valid_classes", 0) == 50257;
  CHECK(masked);
}

TEST_CASE("padded vocabulary: the padding rows start zero, the others as without padding", "[gpt2]") {
  models::TransformerConfig c = small_gpt2();
  const models::Model padded = models::build_transformer(c, "gpt2");
  c.vocab_multiple = 1;
  const models::Model unpadded = models::build_transformer(c, "gpt2");
  Scope a, b;
  initialize_persistables(padded.program, a, 7);
  initialize_persistables(unpadded.program, b, 7);
  const Tensor& wte = a.get("transformer.wte.weight");
  REQUIRE(wte.shape() == Shape{kPaddedVocab, 64});
  REQUIRE(b.get("transformer.wte.weight").shape() == Shape{kVocab, 64});
  CHECK(mix::testing::all_zero(row_range(wte, kVocab, kPaddedVocab)));
  mix::testing::expect_identical(row_range(wte, 0, kVocab), b.get("transformer.wte.weight"), "wte's real rows");
}

TEST_CASE("GPT-2 parity with PyTorch: padded vocabulary against nanoGPT's unpadded one, FP32", "[gpt2][parity]") {
  Run run(false);
  const float loss = run.step();
  check_close("loss vs torch", scalar(loss), get("loss"), kLossTol);
  check_close("loss vs float64", scalar(loss), get("loss64"), kLossTol);
  REQUIRE(run.train.param_grads.size() == run.model.program.parameters().size());
  for (auto& [param, grad] : run.train.param_grads) {
    const Tensor& g = run.scope.get(grad);
    if (param == "transformer.wte.weight") {
      REQUIRE(g.shape() == Shape{kPaddedVocab, 64});
      // The padding rows: no token looks them up and their logits are masked, so exactly 0.
      CHECK(mix::testing::all_zero(row_range(g, kVocab, kPaddedVocab)));
      check_close("gradient of wte's real rows vs torch", row_range(g, 0, kVocab), get("grad." + param), kGradTol);
      check_close("gradient of wte's real rows vs float64", row_range(g, 0, kVocab), get("grad64." + param),
                  kGradTol);
      continue;
    }
    check_close("gradient of " + param + " vs torch", g, get("grad." + param), kGradTol);
    check_close("gradient of " + param + " vs float64", g, get("grad64." + param), kGradTol);
  }
  const Tensor& logits = run.scope.get(run.model.logits);
  REQUIRE(logits.dim(-1) == kPaddedVocab);
  check_close("logits vs torch", column_range(logits, 0, kVocab), get("logits"), kLogitTol);
  check_close("logits vs float64", column_range(logits, 0, kVocab), get("logits64"), kLogitTol);
}

TEST_CASE("GPT-2 parity with PyTorch: AMP loss and master gradients, padding masked", "[gpt2][parity][amp]") {
  Run run(true);
  const float loss = run.step();
  REQUIRE(!run.train.found_inf.empty());
  REQUIRE(run.scope.get(run.train.found_inf).item_float() == 0.f);
  check_close("AMP loss vs torch FP32", scalar(loss), get("loss"), kAmpLossTol);
  const Tensor& wte = run.grad_of("transformer.wte.weight");
  CHECK(wte.dtype() == DType::f32);
  CHECK(mix::testing::all_zero(row_range(wte, kVocab, kPaddedVocab)));
  check_close("AMP gradient of wte's real rows vs torch FP32", row_range(wte, 0, kVocab),
              get("grad.transformer.wte.weight"), kAmpGradTol);
  check_close("AMP gradient of c_fc vs torch FP32", run.grad_of("transformer.h.1.mlp.c_fc.weight"),
              get("grad.transformer.h.1.mlp.c_fc.weight"), kAmpGradTol);
}

TEST_CASE("GPT-2: an AdamW step with weight decay leaves the padding rows at zero", "[gpt2]") {
  Run run(false, optim::OptimizerKind::adamw, 1e-2f);
  const Tensor before = run.scope.get("transformer.wte.weight").clone();
  CHECK(mix::testing::all_zero(row_range(before, kVocab, kPaddedVocab)));  // --init-from zeroed them
  run.step();
  const Tensor& after = run.scope.get("transformer.wte.weight");
  CHECK(mix::testing::all_zero(row_range(after, kVocab, kPaddedVocab)));
  CHECK(row_range(after, 0, kVocab).to_floats() != row_range(before, 0, kVocab).to_floats());  // the rest trained
}

TEST_CASE("GPT-2: --init-from takes wte with every row or the unpadded ones, nothing else", "[gpt2]") {
  reference();
  const models::Model m = models::build_transformer(small_gpt2(), "gpt2");
  Scope scope;
  initialize_persistables(m.program, scope, 1);
  const io::SafetensorsFile torch_state = io::read_safetensors(state_dict_path());
  const fs::path dir = fs::temp_directory_path();
  auto write_with_wte = [&](const Tensor& wte, const std::string& file) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (auto& [name, t] : torch_state.tensors) tensors.emplace_back(name, name == "transformer.wte.weight" ? wte : t);
    const std::string path = (dir / (file + std::to_string(getpid()) + ".safetensors")).string();
    io::write_safetensors(path, tensors, {});
    return path;
  };
  // The padded model's own layout (a mixtrain checkpoint) loads as it is.
  const Tensor full = uniform_tensor({kPaddedVocab, 64}, 3);
  const std::string padded_file = write_with_wte(full, "mix_gpt2_padded_");
  io::load_parameters(padded_file, m.program, scope);
  CHECK(scope.get("transformer.wte.weight").to_floats() == full.to_floats());
  // Any other row count is an error naming both layouts.
  const std::string wrong_file = write_with_wte(uniform_tensor({kVocab + 1, 64}, 3), "mix_gpt2_wrong_");
  CHECK_THROWS_WITH(io::load_parameters(wrong_file, m.program, scope),
                    Catch::Matchers::Contains("transformer.wte.weight") && Catch::Matchers::Contains("[101, 64]") &&
                        Catch::Matchers::Contains("[100, 64] without the vocabulary's padding rows"));
  fs::remove(padded_file);
  fs::remove(wrong_file);
}
