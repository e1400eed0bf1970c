// Token shards (runtime/data/token_shards.h): llm.c's shards and nanoGPT's
// headerless files written here byte by byte, read back as windows; every
// damaged file refused naming it; the sampler's ranks over the windows; and
// scripts/make_token_shards.py --split fortunes giving load_byte_text's examples.
#include "runtime/data/token_shards.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "tests/unit/temp_files.h"

using namespace mix;
using namespace mix::data;
using Catch::Matchers::Contains;
using mix::test::TempDir;
using mix::test::write_bytes;

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// An llm.c shard, written independently of the reader: header ints, then tokens of `width` bytes.
std::string shard(const std::vector<uint64_t>& tokens, int32_t version = 1, int32_t magic = kTokenShardMagic,
                  int64_t header_count = -1) {
  std::string out;
  put_le(out, static_cast<uint32_t>(magic), 4);
  put_le(out, static_cast<uint32_t>(version), 4);
  put_le(out, static_cast<uint32_t>(header_count >= 0 ? header_count : static_cast<int64_t>(tokens.size())), 4);
  out.resize(1024, '\0');
  for (uint64_t t : tokens) put_le(out, t, version == 7 ? 4 : 2);
  return out;
}

std::string headerless(const std::vector<uint64_t>& tokens, int width) {
  std::string out;
  for (uint64_t t : tokens) put_le(out, t, width);
  return out;
}

std::vector<uint64_t> ramp(int64_t n, uint64_t start, uint64_t modulo) {
  std::vector<uint64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (start + static_cast<uint64_t>(i) * 7) % modulo;
  return v;
}

// Examples idx through the source's read, as gather_batch asks for them: rows of inputs then labels.
std::pair<std::vector<int64_t>, std::vector<int64_t>> read_rows(const Dataset& ds, const std::vector<int64_t>& idx) {
  const int64_t c = ds.example_shape()[0];
  const auto n = static_cast<int64_t>(idx.size());
  Tensor x = Tensor::empty({n, c}, DType::i64), y = Tensor::empty({n, c}, DType::i64);
  ds.source->read(idx, 0, n, 0, x, y);
  return {std::vector<int64_t>(x.data<int64_t>(), x.data<int64_t>() + n * c),
          std::vector<int64_t>(y.data<int64_t>(), y.data<int64_t>() + n * c)};
}

std::string source_dir() {
  if (const char* src = std::getenv("MIX_SOURCE_DIR"); src && *src) return src;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}

}  // namespace

TEST_CASE("an llm.c shard reads back as windows of context + 1 tokens at stride context", "[data][tokens]") {
  TempDir dir;
  const std::vector<uint64_t> train = ramp(1000, 3, 256), val = ramp(100, 5, 256);
  write_bytes(dir.file("bytes_train_000000.bin"), shard(train));
  write_bytes(dir.file("bytes_val_000000.bin"), shard(val));
  const int64_t context = 16;
  const TrainTest tt = load_token_shards(dir.path.string(), context, 256, std::nullopt);
  REQUIRE(tt.train.size() == (1000 - 1) / context);
  REQUIRE(tt.test.size() == (100 - 1) / context);
  CHECK(tt.train.example_shape() == Shape{context});
  CHECK(tt.train.input_dtype() == DType::i64);
  CHECK(tt.train.source->label_shape() == Shape{context});
  CHECK(tt.train.num_classes == 256);
  CHECK_FALSE(tt.train.in_memory());

  const std::vector<int64_t> idx = {61, 0, 7};
  const auto [x, y] = read_rows(tt.train, idx);
  for (size_t r = 0; r < idx.size(); ++r)
    for (int64_t t = 0; t < context; ++t) {
      const auto at = static_cast<size_t>(idx[r] * context + t);
      CHECK(x[r * context + t] == static_cast<int64_t>(train[at]));
      CHECK(y[r * context + t] == static_cast<int64_t>(train[at + 1]));  // the next token
    }
  const auto [vx, vy] = read_rows(tt.test, {5});
  CHECK(vx.front() == static_cast<int64_t>(val[5 * context]));
  CHECK(vy.back() == static_cast<int64_t>(val[6 * context]));
}

TEST_CASE("shards are read in name order and windows never cross a shard's end", "[data][tokens]") {
  TempDir dir;
  // Token values tell the shards apart: a window mixing two would hold both ranges.
  std::vector<uint64_t> a(50), b(33);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 1000 + i;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 2000 + i;
  write_bytes(dir.file("x_train_000001.bin"), shard(b, 7));  // written first, read second
  write_bytes(dir.file("x_train_000000.bin"), shard(a, 7));
  write_bytes(dir.file("x_val_000000.bin"), shard(a, 7));
  write_bytes(dir.file("notes_train.txt"), "not a shard");  // not *.bin: ignored
  const int64_t context = 8;
  const TrainTest tt = load_token_shards(dir.path.string(), context, 4096, std::nullopt);
  // 49 / 8 = 6 windows of the first shard, 32 / 8 = 4 of the second; the tails are dropped.
  REQUIRE(tt.train.size() == 10);
  const auto* src = dynamic_cast<const TokenShardSource*>(tt.train.source.get());
  REQUIRE(src != nullptr);
  CHECK(src->files().front().find("x_train_000000.bin") != std::string::npos);
  CHECK(src->tokens() == 83);
  CHECK(src->window(0).front() == 1000);
  CHECK(src->window(5).back() == 1000 + 48);
  CHECK(src->window(6).front() == 2000);
  CHECK(src->window(9).back() == 2000 + 32);
  for (int64_t w = 0; w < tt.train.size(); ++w) {
    const std::vector<int64_t> win = src->window(w);
    CHECK(win.front() / 1000 == win.back() / 1000);
  }
}

TEST_CASE("version 7 shards hold uint32 tokens beyond 65535", "[data][tokens]") {
  TempDir dir;
  std::vector<uint64_t> t(40);
  for (size_t i = 0; i < t.size(); ++i) t[i] = 70000 + i * 1000;  // up to 109000
  write_bytes(dir.file("llama_train_0.bin"), shard(t, 7));
  write_bytes(dir.file("llama_val_0.bin"), shard(t, 7));
  const TrainTest tt = load_token_shards(dir.path.string(), 4, 128256, std::nullopt);
  REQUIRE(tt.train.size() == 9);
  const auto [x, y] = read_rows(tt.train, {2});
  CHECK(x == std::vector<int64_t>{78000, 79000, 80000, 81000});
  CHECK(y == std::vector<int64_t>{79000, 80000, 81000, 82000});
  CHECK(tt.test.num_classes == 128256);
}

TEST_CASE("nanoGPT's headerless train.bin and val.bin, uint16 unless --token-dtype says uint32", "[data][tokens]") {
  const std::vector<uint64_t> t = ramp(65, 1, 50257);
  {
    TempDir dir;
    write_bytes(dir.file("train.bin"), headerless(t, 2));
    write_bytes(dir.file("val.bin"), headerless(t, 2));
    const TrainTest tt = load_token_shards(dir.path.string(), 8, 50304, std::nullopt);
    REQUIRE(tt.train.size() == 8);
    const auto [x, y] = read_rows(tt.train, {7});
    CHECK(x.front() == static_cast<int64_t>(t[56]));
    CHECK(y.back() == static_cast<int64_t>(t[64]));
    const auto* src = dynamic_cast<const TokenShardSource*>(tt.test.source.get());
    REQUIRE(src != nullptr);
    CHECK(src->tokens() == 65);
  }
  {
    TempDir dir;
    std::vector<uint64_t> big = t;
    big[3] = 100000;
    write_bytes(dir.file("train.bin"), headerless(big, 4));
    write_bytes(dir.file("val.bin"), headerless(big, 4));
    const TrainTest tt = load_token_shards(dir.path.string(), 8, 128256, TokenDType::uint32);
    REQUIRE(tt.train.size() == 8);
    CHECK(read_rows(tt.train, {0}).first[3] == 100000);
    // A size that is no whole number of the flag's tokens is caught (a wrong --token-dtype, often).
    write_bytes(dir.file("val.bin"), headerless(big, 4) + "x");
    CHECK_THROWS_WITH(load_token_shards(dir.path.string(), 8, 128256, TokenDType::uint32),
                      Contains(dir.file("val.bin")) && Contains("not a whole number of uint32 tokens"));
  }
}

TEST_CASE("damaged token files are refused, naming the file", "[data][tokens]") {
  TempDir dir;
  const std::vector<uint64_t> good = ramp(200, 0, 256);
  const std::string train = dir.file("d_train_000000.bin"), val = dir.file("d_val_000000.bin");
  write_bytes(val, shard(good));
  const std::string d = dir.path.string();
  auto load = [&](int64_t vocab = 256, std::optional<TokenDType> dtype = std::nullopt) {
    return load_token_shards(d, 16, vocab, dtype);
  };

  write_bytes(train, shard(good, 1, 20240519));
  CHECK_THROWS_WITH(load(), Contains(train) && Contains("20240520") && Contains("20240519"));
  write_bytes(train, shard(good, 3));
  CHECK_THROWS_WITH(load(), Contains(train) && Contains("version 3"));
  write_bytes(train, shard(good, 1, kTokenShardMagic, 300));  // header says 300 tokens, 200 follow
  CHECK_THROWS_WITH(load(), Contains(train) && Contains("cut short") && Contains("300"));
  write_bytes(train, shard(good, 1, kTokenShardMagic, 150));  // more bytes than the header's count
  CHECK_THROWS_WITH(load(), Contains(train) && Contains("100 bytes after the 150 tokens"));
  write_bytes(train, shard(good).substr(0, 500));  // shorter than the header itself
  CHECK_THROWS_WITH(load(), Contains(train) && Contains("less than llm.c's header"));
  write_bytes(train, "");
  CHECK_THROWS_WITH(load(), Contains(train));

  std::vector<uint64_t> bad = good;
  bad[123] = 256;
  write_bytes(train, shard(bad));
  CHECK_THROWS_WITH(load(), Contains(train) && Contains("token 256 at position 123") && Contains("--vocab 256"));
  CHECK(load(257).train.size() == 12);  // the same file within a larger vocabulary

  write_bytes(train, shard(good));
  CHECK(load().train.size() == 12);
  CHECK_THROWS_WITH(load(256, TokenDType::uint32),
                    Contains(train) && Contains("--token-dtype") && Contains("version 1"));
  CHECK(load(256, TokenDType::uint16).train.size() == 12);  // agrees with the header: allowed

  // An empty split: a validation shard too short for one window of 17 tokens.
  write_bytes(val, shard(ramp(16, 0, 256)));
  CHECK_THROWS_WITH(
      load(), Contains("validation split") && Contains(val) && Contains("16 tokens") && Contains("one window of 17"));
  std::filesystem::remove(val);
  CHECK_THROWS_WITH(load(), Contains(d) && Contains("no validation shards"));
  std::filesystem::remove(train);
  CHECK_THROWS_WITH(load(), Contains(d) && Contains("no token files") && Contains("make_token_shards.py"));
  CHECK_THROWS_WITH(load_token_shards(dir.file("missing"), 16, 256, std::nullopt),
                    Contains(dir.file("missing")) && Contains("does not exist"));
  write_bytes(dir.file("train.bin"), headerless(good, 2));
  CHECK_THROWS_WITH(load(), Contains(d) && Contains("no val.bin"));
}

TEST_CASE("a refused token file leaves no mapping behind", "[data][tokens]") {
  // Found by the token_shards fuzz target (tests/fuzz/): a constructor that
  // throws runs no destructor, so each refused file stayed mapped until the
  // process ended; thousands of refusals made every later mapping slower.
  TempDir dir;
  const std::string good = dir.file("good_train_000000.bin"), bad = dir.file("bad_train_000000.bin");
  write_bytes(good, shard(ramp(200, 0, 256)));
  std::vector<uint64_t> tokens = ramp(200, 0, 256);
  tokens[150] = 999;  // out of the vocabulary: refused after both files are mapped
  write_bytes(bad, shard(tokens));
  auto mappings_of = [](const std::string& path) {
    std::ifstream maps("/proc/self/maps");
    int n = 0;
    for (std::string line; std::getline(maps, line);) n += line.find(path) != std::string::npos;
    return n;
  };
  CHECK_THROWS_WITH(TokenShardSource({good, bad}, false, std::nullopt, 16, 256), Contains(bad));
  CHECK(mappings_of(good) == 0);
  CHECK(mappings_of(bad) == 0);
  {
    const TokenShardSource whole({good}, false, std::nullopt, 16, 256);
    CHECK(mappings_of(good) == 1);  // the check above can see a mapping
  }
  CHECK(mappings_of(good) == 0);
}

TEST_CASE("the sampler's ranks read disjoint windows that together are one rank's", "[data][tokens]") {
  TempDir dir;
  // Unique tokens: a window is known by its first token. Two shards of 61 and
  // 37 windows: 98 in all, a multiple of neither 3 nor 4, so ranks get padded.
  std::vector<uint64_t> a(61 * 10 + 1), b(37 * 10 + 5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = i;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 100000 + i;
  write_bytes(dir.file("s_train_0.bin"), shard(a, 7));
  write_bytes(dir.file("s_train_1.bin"), shard(b, 7));
  write_bytes(dir.file("s_val_0.bin"), shard(a, 7));
  const TrainTest tt = load_token_shards(dir.path.string(), 10, 200000, std::nullopt);
  REQUIRE(tt.train.size() == 98);

  auto firsts = [&](const std::vector<int64_t>& idx) {
    const auto rows = read_rows(tt.train, idx).first;
    std::vector<int64_t> f;
    for (size_t r = 0; r < idx.size(); ++r) f.push_back(rows[r * 10]);
    return f;
  };
  for (int64_t epoch : {0, 3}) {
    const std::vector<int64_t> one = firsts(DistributedSampler(98, 0, 1, true, 42).indices(epoch));
    const std::set<int64_t> all(one.begin(), one.end());
    REQUIRE(all.size() == 98);  // one rank reads every window once
    for (int world : {2, 3, 4}) {
      std::set<int64_t> seen;
      int64_t padded = 0;
      for (int rank = 0; rank < world; ++rank) {
        const std::vector<int64_t> mine = firsts(DistributedSampler(98, rank, world, true, 42).indices(epoch));
        for (int64_t w : mine) padded += !seen.insert(w).second;
      }
      CAPTURE(world, epoch);
      CHECK(seen == all);
      // DistributedSampler pads the epoch to a multiple of the world by
      // repeating its first windows; nothing else repeats.
      CHECK(padded == (world - 98 % world) % world);
      // With drop_last, the ranks' windows are strictly disjoint.
      std::set<int64_t> dropped;
      int64_t repeats = 0;
      for (int rank = 0; rank < world; ++rank)
        for (int64_t w : firsts(DistributedSampler(98, rank, world, true, 42, true).indices(epoch)))
          repeats += !dropped.insert(w).second;
      CHECK(repeats == 0);
      CHECK(static_cast<int64_t>(dropped.size()) == 98 / world * world);
    }
  }
}

TEST_CASE("make_token_shards.py --split fortunes gives load_byte_text's examples", "[data][tokens][python]") {
  TempDir dir;
  const std::filesystem::path text = dir.path / "text";
  std::filesystem::create_directories(text);
  // Two files of fortunes separated by '%' lines (one without a final newline), an index and a link to skip.
  std::string f1, f2;
  for (int i = 0; i < 30; ++i)
    f1 += "fortune " + std::to_string(i) + " says\nline two of " + std::to_string(i) + "\n%\n";
  for (int i = 0; i < 17; ++i) f2 += "second file " + std::to_string(i * 31) + "\n%\n";
  f2 += "no final newline";
  write_bytes((text / "alpha").string(), f1);
  write_bytes((text / "beta").string(), f2);
  write_bytes((text / "alpha.dat").string(), std::string("\x00\x02\xff", 3));
  std::filesystem::create_symlink("alpha", text / "alpha.u8");

  const std::string out = dir.file("shards");
  const std::string cmd = std::string(mix::test::kPython) + " " + source_dir() +
                          "/scripts/make_token_shards.py --split fortunes " + out + " " + text.string() + " >/dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const int64_t context = 8;
  const TrainTest bytes = load_byte_text(text.string(), context);
  const TrainTest shards = load_token_shards(out, context, 256, std::nullopt);
  for (const auto& [b, s] : {std::pair{&bytes.train, &shards.train}, std::pair{&bytes.test, &shards.test}}) {
    REQUIRE(b->size() == s->size());
    std::vector<int64_t> all(static_cast<size_t>(s->size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    const auto [x, y] = read_rows(*s, all);
    CHECK(x == std::vector<int64_t>(b->inputs.data<int64_t>(), b->inputs.data<int64_t>() + b->inputs.numel()));
    CHECK(y == std::vector<int64_t>(b->labels.data<int64_t>(), b->labels.data<int64_t>() + b->labels.numel()));
  }
}
