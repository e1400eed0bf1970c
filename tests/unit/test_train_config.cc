// launch/train_config.cc, mixtrain's command line: flags parse into typed
// settings (enums), a value outside a flag's choices or a misspelt flag is
// refused with what to type instead, --help shows every flag with its values
// and default and none of CLI11's own notation, and --version says what the
// build is. Then the flags that pick how a GPU runs convolutions: the graph API
// by default, its negation, and --cudnn-benchmark, which times the legacy
// calls' algorithms and so turns the graph API off (or is refused beside an
// explicit --cudnn-graph-conv, where one of the two would do nothing). Last,
// numbers that cannot work (a --seed past 2^64 - 1, a positive value that is 0
// in FP32, a --grad-predivide that zeroes every FP16 gradient) are refused,
// ones that may not (a tiny --lr, a --grad-predivide above the world size) are
// warned about, and --eval-batch-size sets the evaluation batch.
#include <catch2/catch.hpp>

#include <iostream>
#include <limits>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "launch/train_config.h"

using namespace mix::launch;
using Catch::Matchers::Contains;

namespace {

struct Parsed {
  std::optional<int> stop;  // the exit code when parsing says stop
  TrainConfig config;
  std::string out, err;     // what parsing printed
};

Parsed parse(std::vector<std::string> flags) {
  flags.insert(flags.begin(), "mixtrain");
  std::vector<char*> argv;
  for (auto& f : flags) argv.push_back(f.data());
  Parsed p;
  std::ostringstream out, err;
  std::streambuf* old_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
  p.stop = parse_train_config(static_cast<int>(argv.size()), argv.data(), p.config);
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  p.out = out.str();
  p.err = err.str();
  return p;
}

}  // namespace

TEST_CASE("choice flags parse into their enums, and the defaults are the documented ones", "[train_config]") {
  const Parsed d = parse({});
  REQUIRE_FALSE(d.stop);
  CHECK(d.config.precision == mix::amp::Precision::amp);
  CHECK(d.config.effective_grad_reduce() == mix::collective::GradReduce::fp16);
  CHECK(d.config.optimizer.kind == mix::optim::OptimizerKind::momentum);
  CHECK(d.config.optimizer.effective_weight_decay() == 0.0);
  CHECK(d.config.lr_schedule == mix::optim::Schedule::constant);
  CHECK(d.config.device == mix::DeviceKind::cpu);
  CHECK(d.config.data == DataSet::fashion_mnist);
  CHECK(d.config.loss_scaler_config().init_loss_scaling == 32768.f);

  const Parsed p = parse({"--precision", "fp32", "--optimizer", "adamw", "--lr-schedule", "onecycle", "--device",
                          "cuda", "--data", "synthetic", "--on-min-scale", "continue"});
  REQUIRE_FALSE(p.stop);
  CHECK(p.config.precision == mix::amp::Precision::fp32);
  CHECK(p.config.effective_grad_reduce() == mix::collective::GradReduce::fp32);  // FP32's default
  CHECK(p.config.optimizer.kind == mix::optim::OptimizerKind::adamw);
  CHECK(p.config.optimizer.effective_weight_decay() == 0.01);  // torch.optim.AdamW's default
  CHECK(p.config.lr_schedule == mix::optim::Schedule::onecycle);
  CHECK(p.config.device == mix::DeviceKind::cuda);
  CHECK(p.config.data == DataSet::synthetic);
  CHECK(p.config.on_min_scale == mix::amp::LossScalerConfig::OnMinScale::continue_);

  // BF16: the lists in BF16, FP32 all-reduce and no loss scale unless asked for.
  const Parsed bf = parse({"--precision", "bf16"});
  REQUIRE_FALSE(bf.stop);
  CHECK(bf.config.precision == mix::amp::Precision::bf16);
  CHECK(bf.config.effective_grad_reduce() == mix::collective::GradReduce::fp32);
  CHECK(bf.config.loss_scaler_config().mode == mix::amp::LossScalerConfig::Mode::none);
  const Parsed bf_scaled = parse({"--precision", "bf16", "--loss-scaling", "dynamic", "--grad-reduce", "bf16"});
  REQUIRE_FALSE(bf_scaled.stop);
  CHECK(bf_scaled.config.loss_scaler_config().mode == mix::amp::LossScalerConfig::Mode::dynamic);
  CHECK(bf_scaled.config.effective_grad_reduce() == mix::collective::GradReduce::bf16);

  const Parsed torch = parse({"--loss-scaling-preset", "pytorch"});
  REQUIRE_FALSE(torch.stop);
  CHECK(torch.config.loss_scaler_config().init_loss_scaling == 65536.f);
  const Parsed fixed = parse({"--loss-scaling", "static", "--init-loss-scaling", "128"});
  REQUIRE_FALSE(fixed.stop);
  CHECK(fixed.config.loss_scaler_config().mode == mix::amp::LossScalerConfig::Mode::static_scale);
  CHECK(fixed.config.loss_scaler_config().init_loss_scaling == 128.f);

  const Parsed lm = parse({"--model", "transformer"});  // the model's own data set
  REQUIRE_FALSE(lm.stop);
  CHECK(lm.config.data == DataSet::fortunes);
  const Parsed nhwc = parse({"--model", "resnet-small", "--data-format", "nhwc"});
  REQUIRE_FALSE(nhwc.stop);
  CHECK(nhwc.config.data_format == DataFormat::nhwc);
  CHECK(nhwc.config.resnet_channels_last());
}

TEST_CASE("a value outside a flag's choices is refused, naming the flag and its values", "[train_config]") {
  const Parsed p = parse({"--precision", "fp16"});
  REQUIRE(p.stop);
  CHECK(*p.stop == 2);
  CHECK_THAT(p.err, Contains("--precision") && Contains("fp32, amp or bf16") && Contains("'fp16'"));
  const Parsed o = parse({"--optimizer", "adam"});
  REQUIRE(o.stop);
  CHECK_THAT(o.err, Contains("sgd, momentum or adamw"));
  // The rule between two flags, written once (launch/train_program.h).
  const Parsed r = parse({"--precision", "fp32", "--grad-reduce", "fp16"});
  REQUIRE(r.stop);
  CHECK(*r.stop == 2);
  CHECK_THAT(r.err, Contains("--grad-reduce fp16 needs --precision amp"));
}

TEST_CASE("a misspelt flag is answered with the nearest one", "[train_config]") {
  const Parsed typo = parse({"--grad-reduc", "fp16"});
  REQUIRE(typo.stop);
  CHECK(*typo.stop == 2);
  CHECK_THAT(typo.err, Contains("unknown flag --grad-reduc (did you mean --grad-reduce?)"));
  CHECK_THAT(typo.err, !Contains("'fp16'"));  // the value belongs to the misspelt flag: no second complaint
  const Parsed swapped = parse({"--precison", "amp"});
  CHECK_THAT(swapped.err, Contains("did you mean --precision?"));
  const Parsed cut = parse({"--benchmark-warm", "3"});
  CHECK_THAT(cut.err, Contains("did you mean --benchmark-warmup?"));
  // Nothing near: no guess, and where to look.
  const Parsed far = parse({"--frobnicate"});
  REQUIRE(far.stop);
  CHECK_THAT(far.err, Contains("unknown flag --frobnicate") && !Contains("did you mean") &&
                          Contains("mixtrain --help"));
  const Parsed stray = parse({"5"});
  REQUIRE(stray.stop);
  CHECK_THAT(stray.err, Contains("unexpected value '5'"));
}

TEST_CASE("--help lists every flag by topic with its values and default, in plain words", "[train_config]") {
  const Parsed h = parse({"--help"});
  REQUIRE(h.stop);
  CHECK(*h.stop == 0);
  // None of CLI11's own notation: a negated flag's captured value, a type with its choices and default.
  CHECK_THAT(h.out, !Contains("{false}") && !Contains("{true}") && !Contains("TEXT:{") && !Contains(":POSITIVE"));
  for (const char* group : {"Model:", "Data:", "Precision and AMP:", "Loss scaling (amp, bf16):", "Data parallelism:",
                            "Optimizer and schedule:", "Checkpoints, metrics and evaluation:", "Devices:",
                            "Whole-step passes", "Testing aids:", "Environment:"})
    CHECK_THAT(h.out, Contains(group));
  CHECK_THAT(h.out, Contains("--precision fp32|amp") && Contains("[default: amp]"));
  CHECK_THAT(h.out, Contains("--steps INT") && Contains("[default: all the steps of --epochs]"));
  CHECK_THAT(h.out, Contains("--weight-decay FLOAT") && Contains("[default: 0; 0.01 for adamw"));
  CHECK_THAT(h.out, Contains("--hidden INT,...") && Contains("[default: 256,128]"));
  CHECK_THAT(h.out, Contains("--no-fuse-add-relu ") && Contains("MIX_PROFILE_OPS") && Contains("MIX_NCCL_TIMEOUT_S"));
}

TEST_CASE("--version says the version, the commit and the libraries of the build", "[train_config]") {
  const Parsed v = parse({"--version"});
  REQUIRE(v.stop);
  CHECK(*v.stop == 0);
  CHECK(std::regex_search(v.out, std::regex(R"(^mixtrain \d+\.\d+\.\d+ \(commit [0-9a-z+]+\))")));
  CHECK_THAT(v.out, Contains("built with: ") && Contains("OpenBLAS"));
}

TEST_CASE("--eval-batch-size sets the evaluation batch; its default is documented", "[train_config]") {
  CHECK(parse({}).config.effective_eval_batch_size() == 1000);
  CHECK(parse({"--model", "transformer", "--batch-size", "4"}).config.effective_eval_batch_size() == 16);
  CHECK(parse({"--model", "transformer", "--batch-size", "32"}).config.effective_eval_batch_size() == 32);
  const Parsed given = parse({"--eval-batch-size", "250", "--eval-batches", "2"});
  REQUIRE_FALSE(given.stop);
  CHECK(given.config.effective_eval_batch_size() == 250);
  const Parsed zero = parse({"--eval-batch-size", "0"});
  REQUIRE(zero.stop);
  CHECK(*zero.stop == 2);
  const Parsed h = parse({"--help"});
  CHECK_THAT(h.out, Contains("--eval-batch-size INT") && Contains("[default: 1000; transformer: --batch-size"));
  // Every rank must evaluate in the same batches.
  bool fingerprinted = false;
  for (const auto& [name, value] : given.config.fingerprint_fields())
    if (name == "eval-batch-size") fingerprinted = value == "250";
  CHECK(fingerprinted);
}

TEST_CASE("convolutions run on cuDNN's graph API unless asked otherwise", "[train_config]") {
  const Parsed defaults = parse({});
  REQUIRE_FALSE(defaults.stop);
  CHECK(defaults.config.cudnn_graph_conv);
  CHECK_FALSE(defaults.config.cudnn_benchmark);

  const Parsed off = parse({"--no-cudnn-graph-conv"});
  REQUIRE_FALSE(off.stop);
  CHECK_FALSE(off.config.cudnn_graph_conv);

  const Parsed on = parse({"--cudnn-graph-conv"});
  REQUIRE_FALSE(on.stop);
  CHECK(on.config.cudnn_graph_conv);
}

TEST_CASE("the transformer's attention is fused unless --no-fused-attention or --dropout", "[train_config]") {
  auto fused_field = [](const TrainConfig& c) {
    for (const auto& [name, value] : c.fingerprint_fields())
      if (name == "fused-attention") return value;
    return std::string("absent");
  };
  const Parsed defaults = parse({"--model", "transformer"});
  REQUIRE_FALSE(defaults.stop);
  CHECK(defaults.config.fused_attention);
  CHECK(fused_field(defaults.config) == "on");  // every rank must build the same attention

  const Parsed off = parse({"--model", "transformer", "--no-fused-attention"});
  REQUIRE_FALSE(off.stop);
  CHECK_FALSE(off.config.fused_attention);
  CHECK(fused_field(off.config) == "off");

  // The fused op has no dropout on its probabilities: --dropout keeps the unfused ops.
  const Parsed dropout = parse({"--model", "transformer", "--dropout", "0.1"});
  REQUIRE_FALSE(dropout.stop);
  CHECK(fused_field(dropout.config) == "off (--dropout)");

  const Parsed mlp = parse({"--model", "mlp", "--no-fused-attention"});
  REQUIRE(mlp.stop);
  CHECK(*mlp.stop == 2);
  CHECK_THAT(mlp.err, Contains("--no-fused-attention is for --model transformer"));
}

TEST_CASE("--cudnn-benchmark runs the legacy calls, whose algorithms it times", "[train_config]") {
  const Parsed bench = parse({"--cudnn-benchmark"});
  REQUIRE_FALSE(bench.stop);
  CHECK(bench.config.cudnn_benchmark);
  CHECK_FALSE(bench.config.cudnn_graph_conv);

  const Parsed both_off = parse({"--cudnn-benchmark", "--no-cudnn-graph-conv"});
  REQUIRE_FALSE(both_off.stop);
  CHECK(both_off.config.cudnn_benchmark);
  CHECK_FALSE(both_off.config.cudnn_graph_conv);

  // Both asked for: one of them would do nothing, so neither is guessed.
  const Parsed both = parse({"--cudnn-benchmark", "--cudnn-graph-conv"});
  REQUIRE(both.stop);
  CHECK(*both.stop == 2);
}

TEST_CASE("--seed takes every 64-bit value and refuses larger ones instead of clamping them", "[train_config]") {
  const Parsed top = parse({"--seed", "18446744073709551615"});
  REQUIRE_FALSE(top.stop);
  CHECK(top.config.seed == std::numeric_limits<uint64_t>::max());
  // CLI11 reads a leading zero as octal: 00042 became seed 34, and --batch-size 010 a batch of 8.
  for (const auto& [flag, value] : {std::pair<const char*, const char*>{"--seed", "00042"}, {"--batch-size", "010"}}) {
    const Parsed p = parse({flag, value});
    REQUIRE(p.stop);
    CHECK(*p.stop == 2);
    CHECK_THAT(p.err, Contains(flag) && Contains("leading zeros") && Contains(std::string("'") + value + "'"));
  }
  const Parsed zero = parse({"--seed", "0"});
  REQUIRE_FALSE(zero.stop);
  CHECK(zero.config.seed == 0);
  // CLI11 read each of these as 2^64 - 1: three seeds, one run.
  for (const char* big : {"18446744073709551616", "18446744073709551625", "100000000000000000000"}) {
    const Parsed p = parse({"--seed", big});
    REQUIRE(p.stop);
    CHECK(*p.stop == 2);
    CHECK_THAT(p.err, Contains("--seed") && Contains(std::string("'") + big + "'") && Contains("2^64 - 1"));
  }
}

TEST_CASE("a positive value that is 0 in FP32 is refused", "[train_config]") {
  // FP32's smallest subnormal is about 1.4e-45: 1e-50 became an lr of 0.
  for (const char* flag : {"--lr", "--bucket-mb", "--init-loss-scaling", "--clip-grad-norm"}) {
    const Parsed p = parse({flag, "1e-50"});
    REQUIRE(p.stop);
    CHECK(*p.stop == 2);
    CHECK_THAT(p.err, Contains(flag) && Contains("'1e-50'") && Contains("FP32"));
  }
  const Parsed tiny = parse({"--lr", "1e-44"});  // a subnormal, not 0: allowed, but warned about (below)
  REQUIRE_FALSE(tiny.stop);
}

TEST_CASE("an lr whose updates FP32 rounds away gets a warning", "[train_config]") {
  const Parsed usual = parse({"--lr", "1e-6"});
  REQUIRE_FALSE(usual.stop);
  CHECK(usual.config.doubtful_values(1).empty());
  const Parsed edge = parse({"--lr", "9.32e-10"});  // just above 2^-30
  REQUIRE_FALSE(edge.stop);
  CHECK(edge.config.doubtful_values(1).empty());
  const Parsed small = parse({"--lr", "1e-12"});
  REQUIRE_FALSE(small.stop);
  const std::vector<std::string> w = small.config.doubtful_values(1);
  REQUIRE(w.size() == 1);
  CHECK_THAT(w[0], Contains("--lr 1e-12") && Contains("FP32") && Contains("raise --lr"));
}

TEST_CASE("--grad-predivide: refused where every FP16 gradient underflows, warned about above the world size",
          "[train_config]") {
  // FP16's largest, 65504, over its smallest subnormal, 2^-24: past that, the sum receives zeros.
  const Parsed huge = parse({"--grad-predivide", "1e30"});
  REQUIRE(huge.stop);
  CHECK(*huge.stop == 2);
  CHECK_THAT(huge.err, Contains("--grad-predivide 1e+30") && Contains("FP16") && Contains("underflow"));
  const Parsed past = parse({"--grad-predivide", "1.11e12"});
  REQUIRE(past.stop);
  const Parsed at = parse({"--grad-predivide", "1.09e12"});
  REQUIRE_FALSE(at.stop);
  // An FP32 or BF16 all-reduce keeps FP32's exponent range: only the warning.
  const Parsed fp32 = parse({"--grad-predivide", "1e30", "--grad-reduce", "fp32"});
  REQUIRE_FALSE(fp32.stop);
  CHECK(fp32.config.doubtful_values(4).size() == 1);

  const Parsed four = parse({"--grad-predivide", "4"});
  REQUIRE_FALSE(four.stop);
  CHECK(four.config.doubtful_values(4).empty());
  CHECK(four.config.doubtful_values(8).empty());
  const std::vector<std::string> w = four.config.doubtful_values(2);
  REQUIRE(w.size() == 1);
  CHECK_THAT(w[0], Contains("--grad-predivide 4") && Contains("world size 2") && Contains("from 1 to 2"));
  CHECK(parse({}).config.doubtful_values(2).empty());  // 0: the world size
}

TEST_CASE("--data token-shards: the transformer's, with a --data-dir; --token-dtype only there", "[train_config]") {
  const Parsed ok = parse({"--model", "transformer", "--data", "token-shards", "--data-dir", "/d", "--token-dtype",
                           "uint32"});
  REQUIRE_FALSE(ok.stop);
  CHECK(ok.config.data == DataSet::token_shards);
  CHECK(ok.config.data_dir == "/d");
  REQUIRE(ok.config.token_dtype);
  CHECK(*ok.config.token_dtype == mix::data::TokenDType::uint32);
  CHECK_FALSE(parse({"--model", "transformer", "--data", "token-shards", "--data-dir", "/d"}).config.token_dtype);
  const Parsed no_dir = parse({"--model", "transformer", "--data", "token-shards"});
  REQUIRE(no_dir.stop);
  CHECK(*no_dir.stop == 2);
  CHECK_THAT(no_dir.err, Contains("--data token-shards needs --data-dir"));
  const Parsed mlp = parse({"--data", "token-shards", "--data-dir", "/d"});
  REQUIRE(mlp.stop);
  CHECK_THAT(mlp.err, Contains("--model transformer"));
  const Parsed stray = parse({"--model", "transformer", "--token-dtype", "uint16"});
  REQUIRE(stray.stop);
  CHECK_THAT(stray.err, Contains("--token-dtype is for --data token-shards"));
  const Parsed bad = parse({"--model", "transformer", "--data", "token-shards", "--data-dir", "/d", "--token-dtype",
                            "int8"});
  REQUIRE(bad.stop);
  CHECK_THAT(bad.err, Contains("uint16") && Contains("uint32"));
}
