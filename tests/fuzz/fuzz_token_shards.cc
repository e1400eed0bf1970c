// Token files (--data tokens): llm.c's shards and nanoGPT's headerless files.
// The input's first byte picks how the file is read (so that one corpus
// covers every way): bit 0 headerless, bits 1-2 what --token-dtype says
// (0: nothing, 1: uint16, 2: uint32), bit 3 a vocabulary of 300 rather than
// GPT-2's 50,257 (so that out-of-vocabulary tokens are common); the rest of
// the input is the file.
#include "runtime/data/token_shards.h"
#include "tests/fuzz/fuzz_files.h"

namespace mix::fuzz {

const char* const kTargetName = "token_shards";

Outcome run_one(const std::string& bytes) {
  const unsigned mode = bytes.empty() ? 0u : static_cast<unsigned char>(bytes[0]);
  const std::string path = write_input("tokens_train_000000.bin", bytes.empty() ? bytes : bytes.substr(1));
  const bool headerless = mode & 1u;
  std::optional<data::TokenDType> flag;
  if (((mode >> 1) & 3u) == 1) flag = data::TokenDType::uint16;
  if (((mode >> 1) & 3u) == 2) flag = data::TokenDType::uint32;
  const int64_t vocab = (mode & 8u) ? 300 : 50257;
  const int64_t context = 4;
  return refused_naming(path, [&] {
    const data::TokenShardSource source({path}, headerless, flag, context, vocab);
    for (int64_t w = 0; w < std::min<int64_t>(source.size(), 64); ++w)
      for (int64_t t : source.window(w))
        if (t < 0 || t >= vocab)
          throw ContractBroken("window " + std::to_string(w) + " holds token " + std::to_string(t));
  });
}

}  // namespace mix::fuzz
