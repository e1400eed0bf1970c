// Token data for the language model: byte-level text from a directory of plain
// files (Debian's fortunes), and synthetic token sequences for benchmarks.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "runtime/core/check.h"
#include "runtime/core/random.h"
#include "runtime/data/dataset.h"

namespace mix::data {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kValidationEvery = 20;  // every 20th entry (5 %) is held out

// Splits a fortune file into entries at lines that hold a single '%'. Each
// entry keeps its separator line, so the model also learns where entries end.
std::vector<std::string> entries_of(const std::string& text) {
  std::vector<std::string> out;
  std::string current, line;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    current += line;
    current += '\n';
    if (line == "%") {
      out.push_back(std::move(current));
      current.clear();
    }
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

// Windows of context + 1 bytes at stride `context` over the stream.
Dataset windows(const std::string& name, const std::string& bytes, int64_t context) {
  const int64_t total = static_cast<int64_t>(bytes.size());
  const int64_t n = total > context ? (total - 1) / context : 0;
  Dataset ds;
  ds.name = name;
  ds.num_classes = 256;
  ds.inputs = Tensor::empty({n, context}, DType::i64);
  ds.labels = Tensor::empty({n, context}, DType::i64);
  int64_t* x = ds.inputs.data<int64_t>();
  int64_t* y = ds.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < context; ++t) {
      x[i * context + t] = static_cast<unsigned char>(bytes[static_cast<size_t>(i * context + t)]);
      y[i * context + t] = static_cast<unsigned char>(bytes[static_cast<size_t>(i * context + t + 1)]);
    }
  return ds;
}

}  // namespace

TrainTest load_byte_text(const std::string& dir, int64_t context, const std::string& name) {
  MIX_CHECK(context > 0, "byte text: the context must be positive, got " << context);
  const std::string install = "install Debian's text with `apt-get install fortunes`, or point --data-dir at a "
                              "directory of plain-text files";
  std::error_code ec;
  MIX_CHECK(fs::is_directory(dir, ec), "text data directory " << dir << " does not exist; " << install);
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const fs::path& p = e.path();
    // fortune's *.dat are binary indexes; *.u8 are links to the plain files.
    if (e.is_symlink() || !e.is_regular_file() || p.extension() == ".dat" || p.extension() == ".u8") continue;
    files.push_back(p);
  }
  std::sort(files.begin(), files.end());
  MIX_CHECK(!files.empty(), "text data directory " << dir << " has no plain-text files; " << install);

  std::string train, validation;
  int64_t entry = 0;
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    MIX_CHECK(in, "cannot read " << f.string() << " (check its permissions)");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (std::string& e : entries_of(text)) (++entry % kValidationEvery == 0 ? validation : train) += e;
  }
  TrainTest tt{windows(name, train, context), windows(name + " validation", validation, context)};
  MIX_CHECK(tt.train.size() > 0 && tt.test.size() > 0,
            "text data directory " << dir << " holds " << train.size() + validation.size()
                                   << " bytes: too little for one window of " << context + 1
                                   << " bytes in each split; " << install);
  return tt;
}

TrainTest make_synthetic_tokens(int64_t train_size, int64_t test_size, int64_t context, int64_t vocab, uint64_t seed) {
  MIX_CHECK(vocab >= 2 && context > 0, "synthetic tokens need a vocabulary of at least 2 and a positive context");
  // The rule (5 * prev + 3) mod vocab makes seven tokens in eight predictable
  // from the one before; the eighth is noise, so the loss floor is above zero.
  auto split = [&](int64_t n, uint64_t stream) {
    Rng rng = Rng::for_stream(seed, stream);
    Dataset ds;
    ds.name = "synthetic tokens";
    ds.num_classes = vocab;
    ds.inputs = Tensor::empty({n, context}, DType::i64);
    ds.labels = Tensor::empty({n, context}, DType::i64);
    int64_t* x = ds.inputs.data<int64_t>();
    int64_t* y = ds.labels.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      int64_t token = static_cast<int64_t>(rng.below(static_cast<uint64_t>(vocab)));
      for (int64_t t = 0; t <= context; ++t) {
        if (t < context) x[i * context + t] = token;
        if (t > 0) y[i * context + t - 1] = token;
        token = rng.below(8) == 0 ? static_cast<int64_t>(rng.below(static_cast<uint64_t>(vocab)))
                                  : (5 * token + 3) % vocab;
      }
    }
    return ds;
  };
  return {split(train_size, 1), split(test_size, 2)};
}

}  // namespace mix::data
