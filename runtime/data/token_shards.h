#pragma once
// Pre-tokenised text on disk, memory-mapped and read a window at a time: the
// shard format of llm.c and the headerless train.bin / val.bin of nanoGPT.
//
// llm.c's shard: a header of 256 little-endian int32 ([0] magic 20240520,
// [1] version: 1 for uint16 tokens, 7 for uint32 tokens, [2] the token count),
// then the tokens, little-endian. nanoGPT's file: the tokens alone (uint16
// unless told otherwise).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/enum_names.h"
#include "runtime/data/dataset.h"
#include "runtime/data/example_source.h"

namespace mix::data {

/// Width of a token on disk. A header's version decides it for llm.c's shards;
/// headerless files need to be told (--token-dtype), uint16 by default.
enum class TokenDType { uint16, uint32 };
inline constexpr NamedValue<TokenDType> kTokenDTypeNames[] = {{TokenDType::uint16, "uint16"},
                                                              {TokenDType::uint32, "uint32"}};

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int64_t kTokenShardHeaderInts = 256;

/// One split (train or val) of token files: each file memory-mapped, the
/// tokens cut into windows of context + 1 tokens.
///
/// Windows: within each file, non-overlapping windows at stride `context`
/// (window w covers tokens [w * context, w * context + context], so the label
/// of a window's last position is the first input of the next), never
/// crossing a file's end: (tokens - 1) / context windows per file, numbered
/// file by file in name order. This is load_byte_text's layout within its one
/// stream, so a split written as one file gives the very same examples as
/// --data fortunes. Windows stay inside a file because each is then one
/// contiguous range of one mapping, and because a file is a unit of the
/// tokeniser's output (llm.c starts every shard at a document boundary), so
/// a window joining two files would read a seam no training text contains;
/// what is lost is under `context` tokens per file. Fixed windows (not random
/// offsets) let the DistributedSampler, seeded by seed and epoch, give each
/// rank its own disjoint windows and a resumed run the same order.
class TokenShardSource : public ExampleSource {
 public:
  /// Maps `files` (all llm.c shards when `headerless` is false, else
  /// nanoGPT files of `headerless_dtype`) and checks them: the header's
  /// magic and version, the file's size against the token count, and every
  /// token below `vocab`. `flag_dtype`: what --token-dtype said, if anything;
  /// a header whose version disagrees is an error. Each error names the file.
  TokenShardSource(const std::vector<std::string>& files, bool headerless, std::optional<TokenDType> flag_dtype,
                   int64_t context, int64_t vocab);
  ~TokenShardSource() override;
  TokenShardSource(const TokenShardSource&) = delete;
  TokenShardSource& operator=(const TokenShardSource&) = delete;

  int64_t size() const override { return window_start_.empty() ? 0 : window_start_.back(); }
  Shape example_shape() const override { return {context_}; }
  DType input_dtype() const override { return DType::i64; }
  Shape label_shape() const override { return {context_}; }
  void read(const std::vector<int64_t>& idx, int64_t begin, int64_t count, int64_t epoch, Tensor& inputs,
            Tensor& labels) const override;

  /// Tokens in all files, and the files (for messages and tests).
  int64_t tokens() const;
  const std::vector<std::string>& files() const { return names_; }
  /// The window `index` as context + 1 tokens (for tests).
  std::vector<int64_t> window(int64_t index) const;

 private:
  struct Mapped {
    std::string path;
    void* base = nullptr;  // the whole file's mapping
    size_t bytes = 0;
    int64_t offset = 0;  // bytes before the first token (the header)
    int64_t count = 0;   // tokens
    TokenDType dtype = TokenDType::uint16;
  };
  int64_t token_at(const Mapped& m, int64_t i) const;
  void release(const Mapped& m, int64_t first, int64_t last) const;
  void unmap_all();

  std::vector<Mapped> maps_;
  std::vector<std::string> names_;
  std::vector<int64_t> window_start_;  // window_start_[f]: windows before file f; back(): all windows
  int64_t context_;
};

/// The token files of `dir` as train and validation splits: llm.c's shards
/// DIR/*_train_*.bin and DIR/*_val_*.bin (sorted by name), or else nanoGPT's
/// DIR/train.bin and DIR/val.bin. Examples: inputs i64 [context], labels i64
/// [context] (the next token at each position), as load_byte_text's. Errors
/// (mix::Error) name the directory when it holds no such files, the files of
/// a split too short for one window, and the file of any damage.
TrainTest load_token_shards(const std::string& dir, int64_t context, int64_t vocab,
                            std::optional<TokenDType> token_dtype);

}  // namespace mix::data
