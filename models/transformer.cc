// A GPT-style decoder-only Transformer language model with nanoGPT's structure,
// parameter names and initialisation, so its state_dict round-trips through
// safetensors with a nanoGPT-style PyTorch model (docs/models.md, "Transformer"):
//
//   transformer.wte.weight            [vocab, d]      token embedding (lookup_table); vocab padded, below
//   transformer.wpe.weight            [context, d]    position embedding
//   transformer.h.{i}.ln_1.{weight,bias}              [d]
//   transformer.h.{i}.attn.c_attn.{weight,bias}       [3d, d], [3d]   q, k, v in one GEMM
//   transformer.h.{i}.attn.c_proj.{weight,bias}       [d, d], [d]
//   transformer.h.{i}.ln_2.{weight,bias}              [d]
//   transformer.h.{i}.mlp.c_fc.{weight,bias}          [4d, d], [4d]
//   transformer.h.{i}.mlp.c_proj.{weight,bias}        [d, 4d], [d]
//   transformer.ln_f.{weight,bias}                    [d]
//   lm_head.weight                    [vocab, d]      absent with weight tying (wte is used)
//
// Vocabulary padding (vocab_multiple, GPT-2's 50,257 -> 50,304): wte and lm_head
// get the padded row count, so the output GEMM's N is a multiple of 64, and
// their padding rows start zero (VarDesc::unpadded_rows). The loss masks the
// padding inside softmax_with_cross_entropy (attr valid_classes): the padded
// logits take no part in the row's max and sum and get gradient exactly 0, so
// the output GEMM's weight gradient is exactly 0 on the padding rows, which
// therefore never move (no token id reaches them through the lookup either),
// and the input gradient h gets from them is 0 as well. Loss and gradients are
// the unpadded model's; evaluation's argmax skips the padding the same way.
// Masking in the loss op rather than adding -inf to the logits costs nothing:
// no extra pass over the [tokens, vocab] logits, no -inf in FP16 tensors.
//
// Pre-norm blocks: h += attn(ln_1(h)); h += mlp(ln_2(h)). Attention is one
// `fused_attention` op on the heads [B, heads, T, hd] (white: FP16/BF16 inputs,
// FP32 softmax statistics), which never stores the [B, heads, T, T]
// probabilities. With --no-fused-attention, or with dropout (which the fused op
// does not apply to its probabilities), it is built from ops the AMP lists
// know: the q.k^T and att.v products are `matmul` (white: FP16 on tensor
// cores), the causal softmax is `softmax` with attr causal (black: FP32, or
// FP16 with --amp-white-list softmax). Either way the AMP pass needs no
// attention-specific rule, and both compute the same values up to rounding.
//
// Init as nanoGPT: every weight N(0, 0.02), the two residual projections
// (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 layers)), biases 0, layer-norm
// weights 1. The position embedding is added as a [context, d] tensor
// broadcast over the batch: every training and evaluation sequence is exactly
// `context` tokens long, so positions are always 0..context-1.
#include <cmath>

#include "models/model.h"
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix::models {

namespace {

class TransformerBuilder {
 public:
  TransformerBuilder(Program& p, const TransformerConfig& c) : p_(p), c_(c) {}

  void parameter(const std::string& name, const Shape& shape, VarInit init) { add_parameter(p_, name, shape, init); }

  // y = x W^T + b over the last dim of x [B, T, in]; W is nn.Linear's [out, in].
  std::string linear(const std::string& prefix, const std::string& x, int64_t in, int64_t out, double std) {
    const std::string w = prefix + ".weight", b = prefix + ".bias";
    parameter(w, {out, in}, {VarInit::Kind::normal, std});
    parameter(b, {out}, {VarInit::Kind::zeros, 0.0});
    const std::string xw = p_.unique_name(prefix + ".matmul");
    p_.append_op(make_op("matmul", {{"X", {x}}, {"Y", {w}}}, {{"Out", {xw}}}, {{"transpose_Y", true}}));
    const std::string y = p_.unique_name(prefix + ".out");
    p_.append_op(make_op("elementwise_add", {{"X", {xw}}, {"Y", {b}}}, {{"Out", {y}}}, {{"axis", int64_t{-1}}}));
    return y;
  }

  // nn.LayerNorm(d) over the last dim of x [B, T, d] (eps 1e-5, PyTorch's default).
  std::string layer_norm(const std::string& prefix, const std::string& x) {
    parameter(prefix + ".weight", {c_.d_model}, {VarInit::Kind::constant, 1.0});
    parameter(prefix + ".bias", {c_.d_model}, {VarInit::Kind::zeros, 0.0});
    const std::string y = p_.unique_name(prefix + ".out");
    p_.append_op(make_op("layer_norm", {{"X", {x}}, {"Scale", {prefix + ".weight"}}, {"Bias", {prefix + ".bias"}}},
                         {{"Y", {y}},
                          {"Mean", {p_.unique_name(prefix + ".mean")}},
                          {"Variance", {p_.unique_name(prefix + ".variance")}}},
                         {{"begin_norm_axis", int64_t{2}}, {"epsilon", 1e-5}}));
    return y;
  }

  std::string dropout(const std::string& x, const std::string& where) {
    if (c_.dropout <= 0) return x;
    const std::string y = p_.unique_name(where + ".dropout");
    p_.append_op(make_op("dropout", {{"X", {x}}}, {{"Out", {y}}, {"Mask", {p_.unique_name(where + ".dropout_mask")}}},
                         {{"dropout_prob", c_.dropout},
                          {"seed", static_cast<int64_t>(c_.seed)},
                          {"dropout_implementation", std::string("upscale_in_train")}}));
    return y;
  }

  std::string unary(const std::string& type, const std::string& x, const std::string& name,
                    std::map<std::string, Attr> attrs = {}) {
    const std::string y = p_.unique_name(name);
    p_.append_op(make_op(type, {{"X", {x}}}, {{"Out", {y}}}, std::move(attrs)));
    return y;
  }

  std::string add(const std::string& x, const std::string& y, const std::string& name) {
    const std::string out = p_.unique_name(name);
    p_.append_op(make_op("elementwise_add", {{"X", {x}}, {"Y", {y}}}, {{"Out", {out}}}, {{"axis", int64_t{-1}}}));
    return out;
  }

  // Causal multi-head self-attention of x [B, T, d] -> [B, T, d].
  std::string attention(const std::string& prefix, const std::string& x, double proj_std) {
    const int64_t d = c_.d_model, heads = c_.heads, hd = d / heads;
    const std::string qkv = linear(prefix + ".c_attn", x, d, 3 * d, kStd);  // [B, T, 3d]
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    std::string merged;  // [B, T, heads, hd]
    if (c_.uses_fused_attention()) {
      // fused_attention reads q, k and v where the projection left them, as
      // one [B, T, 3, heads, hd] tensor (attr layout "bthd", input QKV: no
      // split, no transposes; cuDNN reads it through strides), and writes
      // [B, T, heads, hd] for c_proj.
      const std::string packed =
          unary("reshape2", qkv, prefix + ".qkv_heads", {{"shape", std::vector<int64_t>{0, 0, 3, heads, hd}}});
      merged = p_.unique_name(prefix + ".context");
      p_.append_op(make_op("fused_attention", {{"QKV", {packed}}},
                           {{"Out", {merged}}, {"LSE", {p_.unique_name(prefix + ".lse")}}},
                           {{"scale", scale}, {"causal", true}, {"layout", std::string("bthd")}}));
    } else {
      // The reference: q, k, v split and moved to [B, heads, T, hd], scores
      // [B, heads, T, T] = q k^T / sqrt(hd), the causal softmax, its product with v.
      std::vector<std::string> parts{p_.unique_name(prefix + ".q"), p_.unique_name(prefix + ".k"),
                                     p_.unique_name(prefix + ".v")};
      p_.append_op(make_op("split", {{"X", {qkv}}}, {{"Out", parts}}, {{"axis", int64_t{-1}}, {"num", int64_t{3}}}));
      std::vector<std::string> heads_of(3);
      for (size_t i = 0; i < 3; ++i) {
        const std::string split =
            unary("reshape2", parts[i], parts[i] + ".heads", {{"shape", std::vector<int64_t>{0, 0, heads, hd}}});
        heads_of[i] = unary("transpose2", split, parts[i] + ".bhtd", {{"axis", std::vector<int64_t>{0, 2, 1, 3}}});
      }
      const std::string scores = p_.unique_name(prefix + ".scores");
      p_.append_op(make_op("matmul", {{"X", {heads_of[0]}}, {"Y", {heads_of[1]}}}, {{"Out", {scores}}},
                           {{"transpose_Y", true}, {"alpha", scale}}));
      std::string att = unary("softmax", scores, prefix + ".att", {{"axis", int64_t{-1}}, {"causal", true}});
      att = dropout(att, prefix + ".att");
      const std::string ctx = p_.unique_name(prefix + ".context");  // [B, heads, T, hd]
      p_.append_op(make_op("matmul", {{"X", {att}}, {"Y", {heads_of[2]}}}, {{"Out", {ctx}}}));
      merged = unary("transpose2", ctx, prefix + ".context_bthd", {{"axis", std::vector<int64_t>{0, 2, 1, 3}}});
    }
    const std::string flat =
        unary("reshape2", merged, prefix + ".context_btd", {{"shape", std::vector<int64_t>{0, 0, d}}});
    return dropout(linear(prefix + ".c_proj", flat, d, d, proj_std), prefix + ".resid");
  }

  std::string mlp(const std::string& prefix, const std::string& x, double proj_std) {
    const int64_t d = c_.d_model;
    const std::string up = linear(prefix + ".c_fc", x, d, 4 * d, kStd);
    const std::string act = unary("gelu", up, prefix + ".gelu");
    return dropout(linear(prefix + ".c_proj", act, 4 * d, d, proj_std), prefix + ".resid");
  }

  static constexpr double kStd = 0.02;

 private:
  Program& p_;
  const TransformerConfig& c_;
};

}  // namespace

Model build_transformer(const TransformerConfig& c, const std::string& name) {
  MIX_CHECK(c.layers > 0 && c.d_model > 0 && c.heads > 0 && c.context > 0 && c.vocab > 1,
            "transformer: --layers, --d-model, --heads, --context and --vocab must be positive (vocab at least 2)");
  MIX_CHECK(c.d_model % c.heads == 0, "transformer: --d-model " << c.d_model << " is not a multiple of --heads "
                                                                << c.heads << " (each head gets d_model / heads dims)");
  MIX_CHECK(c.dropout >= 0 && c.dropout < 1, "transformer: --dropout must be in [0, 1), got " << c.dropout);
  MIX_CHECK(c.vocab_multiple > 0, "transformer: --vocab-multiple must be positive, got " << c.vocab_multiple);
  Model m;
  m.name = name;
  m.example_shape = {c.context};
  m.label_shape = {c.context};
  m.input_dtype = DType::i64;
  m.num_classes = c.vocab;  // the logits have c.padded_vocab() columns: the loss and evaluation mask the rest
  m.tokens_per_example = c.context;
  Program& p = m.program;
  p.add_var(VarDesc{m.input, {-1, c.context}, DType::i64, false, false, true, {}});
  p.add_var(VarDesc{m.label, {-1, c.context}, DType::i64, false, false, true, {}});

  TransformerBuilder b(p, c);
  const double std = TransformerBuilder::kStd;
  const double proj_std = std / std::sqrt(2.0 * static_cast<double>(c.layers));
  const int64_t vocab_rows = c.padded_vocab();
  // wte, and lm_head below, with the vocabulary's padding rows marked.
  auto vocab_matrix = [&](const std::string& param) {
    b.parameter(param, {vocab_rows, c.d_model}, {VarInit::Kind::normal, std});
    if (vocab_rows != c.vocab) p.var(param).unpadded_rows = c.vocab;
  };
  vocab_matrix("transformer.wte.weight");
  b.parameter("transformer.wpe.weight", {c.context, c.d_model}, {VarInit::Kind::normal, std});

  const std::string tok = p.unique_name("transformer.tok_emb");  // [B, T, d]
  p.append_op(make_op("lookup_table", {{"W", {"transformer.wte.weight"}}, {"Ids", {m.input}}}, {{"Out", {tok}}}));
  std::string h = b.dropout(b.add(tok, "transformer.wpe.weight", "transformer.emb"), "transformer.emb");
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string pre = "transformer.h." + std::to_string(i);
    h = b.add(h, b.attention(pre + ".attn", b.layer_norm(pre + ".ln_1", h), proj_std), pre + ".resid_attn");
    h = b.add(h, b.mlp(pre + ".mlp", b.layer_norm(pre + ".ln_2", h), proj_std), pre + ".resid_mlp");
  }
  h = b.layer_norm("transformer.ln_f", h);
  std::string head = "transformer.wte.weight";
  if (!c.tie_weights) {
    head = "lm_head.weight";
    vocab_matrix(head);
  }
  // logits [B, T, padded vocab] = h . head^T
  p.append_op(make_op("matmul", {{"X", {h}}, {"Y", {head}}}, {{"Out", {m.logits}}}, {{"transpose_Y", true}}));
  // The mean over every token of the batch, the padding columns masked.
  cross_entropy_loss(p, m.logits, m.label, m.loss, vocab_rows != c.vocab ? c.vocab : 0);
  return m;
}

TransformerConfig transformer_preset(TransformerPreset preset) {
  TransformerConfig c;
  switch (preset) {
    case TransformerPreset::transformer:
      break;
    case TransformerPreset::gpt2:
      // GPT-2 small as nanoGPT's GPTConfig has it (n_layer 12, n_head 12,
      // n_embd 768, block_size 1024, bias, tied wte / lm_head), with GPT-2's
      // BPE vocabulary unpadded in the state_dict sense and padded to 50,304
      // for the GEMMs, as nanoGPT and llm.c pad it.
      c.layers = 12;
      c.d_model = 768;
      c.heads = 12;
      c.context = 1024;
      c.vocab = 50257;
      c.vocab_multiple = 64;
      c.tie_weights = true;
      break;
  }
  return c;
}

}  // namespace mix::models
