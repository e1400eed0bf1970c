// Token shards on disk (llm.c's format, nanoGPT's headerless files), mapped
// into memory and read a window at a time, so a corpus far larger than memory
// trains with the same sampler, prefetcher and feeder as the in-memory sets.
#include "runtime/data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/core/check.h"

namespace mix::data {

namespace {

namespace fs = std::filesystem;

int64_t width_of(TokenDType d) { return d == TokenDType::uint16 ? 2 : 4; }
std::string name(TokenDType d) { return std::string(name_of(d, kTokenDTypeNames)); }

// Little-endian whatever the host, as the format says.
uint32_t le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
uint32_t le16(const unsigned char* p) { return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8; }

size_t page_size() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// The scan below reads this much between releases, so its resident pages stay
// a bounded amount whatever the file's size.
constexpr int64_t kScanChunkBytes = int64_t{64} << 20;

}  // namespace

int64_t TokenShardSource::token_at(const Mapped& m, int64_t i) const {
  const auto* p = static_cast<const unsigned char*>(m.base) + m.offset + i * width_of(m.dtype);
  return m.dtype == TokenDType::uint16 ? le16(p) : le32(p);
}

// Drops this process's mapping of the pages holding bytes [first, last) of a
// file. The pages stay in the page cache (a later read is a minor fault, no
// disk read), but they no longer count as this process's memory: without
// this, every page the sampler ever touched would stay resident, and a run
// over a corpus larger than memory would look (to the resident set size, and
// to a cluster's memory limits that count it) as if it held the corpus.
void TokenShardSource::release(const Mapped& m, int64_t first, int64_t last) const {
  const size_t page = page_size();
  const size_t lo = static_cast<size_t>(first) / page * page;
  const size_t hi = std::min(m.bytes, (static_cast<size_t>(last) + page - 1) / page * page);
  if (hi > lo) ::madvise(static_cast<char*>(m.base) + lo, hi - lo, MADV_DONTNEED);
}

TokenShardSource::TokenShardSource(const std::vector<std::string>& files, bool headerless,
                                   std::optional<TokenDType> flag_dtype, int64_t context, int64_t vocab)
    : names_(files), context_(context) {
  MIX_CHECK(context > 0, "token shards: the context must be positive, got " << context);
  window_start_.push_back(0);
  // A constructor that throws runs no destructor: until every file has passed
  // its checks, this guard unmaps what was mapped, so that a refused file
  // leaves no mapping behind.
  struct UnmapOnThrow {
    TokenShardSource* source;
    ~UnmapOnThrow() {
      if (source) source->unmap_all();
    }
  } guard{this};
  for (const std::string& path : files) {
    Mapped m;
    m.path = path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MIX_CHECK(fd >= 0, "cannot open token file " << path << ": " << std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      MIX_FAIL("cannot read token file " << path << ": " << std::strerror(err));
    }
    m.bytes = static_cast<size_t>(st.st_size);
    if (m.bytes > 0) {
      m.base = ::mmap(nullptr, m.bytes, PROT_READ, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);
      MIX_CHECK(m.base != MAP_FAILED, "cannot map token file " << path << " into memory: " << std::strerror(err));
    } else {
      ::close(fd);
    }
    maps_.push_back(m);  // owned from here: unmapped by the guard if a check below throws
    Mapped& f = maps_.back();
    const auto* bytes = static_cast<const unsigned char*>(f.base);

    if (headerless) {
      f.dtype = flag_dtype.value_or(TokenDType::uint16);
      const int64_t w = width_of(f.dtype);
      MIX_CHECK(static_cast<int64_t>(f.bytes) % w == 0,
                "token file " << path << " holds " << f.bytes << " bytes, not a whole number of " << name(f.dtype)
                              << " tokens: is --token-dtype right?");
      f.count = static_cast<int64_t>(f.bytes) / w;
    } else {
      const int64_t header = kTokenShardHeaderInts * 4;
      MIX_CHECK(static_cast<int64_t>(f.bytes) >= header,
                "token shard " << path << " holds " << f.bytes << " bytes, less than llm.c's header of " << header
                               << " bytes: the file is cut short or is not a shard");
      const int32_t magic = static_cast<int32_t>(le32(bytes));
      MIX_CHECK(
          magic == kTokenShardMagic,
          "token shard " << path << " starts with " << magic << ", not llm.c's magic number " << kTokenShardMagic
                         << ": not an llm.c shard (nanoGPT's headerless files are read as train.bin and val.bin)");
      const int32_t version = static_cast<int32_t>(le32(bytes + 4));
      MIX_CHECK(version == 1 || version == 7, "token shard " << path << " has version " << version
                                                             << "; llm.c's versions are 1 (uint16 tokens) and 7 "
                                                                "(uint32 tokens)");
      f.dtype = version == 1 ? TokenDType::uint16 : TokenDType::uint32;
      MIX_CHECK(!flag_dtype || *flag_dtype == f.dtype,
                "token shard " << path << " has version " << version << ", so " << name(f.dtype)
                               << " tokens, but --token-dtype says " << name(*flag_dtype)
                               << ": the flag is for headerless files (train.bin, val.bin); drop it");
      const int64_t count = static_cast<int32_t>(le32(bytes + 8));
      MIX_CHECK(count >= 0, "token shard " << path << " has a negative token count " << count << " in its header");
      const int64_t body = static_cast<int64_t>(f.bytes) - header;
      const int64_t want = count * width_of(f.dtype);
      MIX_CHECK(body >= want, "token shard " << path << " is cut short: its header gives " << count << " "
                                             << name(f.dtype) << " tokens (" << want << " bytes) but " << body
                                             << " bytes follow the header");
      MIX_CHECK(body == want, "token shard " << path << " has " << body - want << " bytes after the " << count
                                             << " tokens its header gives: a damaged header or a different format");
      f.offset = header;
      f.count = count;
    }

    // Every token below the vocabulary, checked once here rather than as each
    // window is read: a bad token then stops the run before its first step,
    // naming the file and the place, instead of failing (or indexing past the
    // embedding) on whichever rank draws that window, maybe far into a run.
    // The pass is sequential over the mapping, at disk or memory speed, small
    // next to training, which reads every token at least once per epoch; the
    // pages are released chunk by chunk, so it holds no more than a chunk.
    const bool can_exceed = f.dtype == TokenDType::uint32 || vocab < 65536;
    if (f.count > 0 && can_exceed) {
      ::madvise(f.base, f.bytes, MADV_SEQUENTIAL);
      const int64_t per_chunk = kScanChunkBytes / width_of(f.dtype);
      for (int64_t lo = 0; lo < f.count; lo += per_chunk) {
        const int64_t hi = std::min(f.count, lo + per_chunk);
        for (int64_t i = lo; i < hi; ++i) {
          const int64_t t = token_at(f, i);
          MIX_CHECK(t < vocab, "token file " << path << " has token " << t << " at position " << i
                                             << ", not below --vocab " << vocab
                                             << ": its tokenizer has a larger vocabulary (raise --vocab)");
        }
        release(f, f.offset + lo * width_of(f.dtype), f.offset + hi * width_of(f.dtype));
      }
    }
    // The sampler reads windows in a random order: reading ahead of one would
    // only fetch pages of windows that another step (or rank) reads.
    if (f.base) ::madvise(f.base, f.bytes, MADV_RANDOM);
    window_start_.push_back(window_start_.back() + (f.count > context ? (f.count - 1) / context : 0));
  }
  guard.source = nullptr;
}

TokenShardSource::~TokenShardSource() { unmap_all(); }

void TokenShardSource::unmap_all() {
  for (Mapped& m : maps_)
    if (m.base && m.base != MAP_FAILED) ::munmap(m.base, m.bytes);
  maps_.clear();
}

int64_t TokenShardSource::tokens() const {
  int64_t n = 0;
  for (const Mapped& m : maps_) n += m.count;
  return n;
}

std::vector<int64_t> TokenShardSource::window(int64_t index) const {
  MIX_CHECK(index >= 0 && index < size(), "token window " << index << " out of range [0, " << size() << ")");
  const size_t f = static_cast<size_t>(std::upper_bound(window_start_.begin(), window_start_.end(), index) -
                                       window_start_.begin() - 1);
  const Mapped& m = maps_[f];
  const int64_t first = (index - window_start_[f]) * context_;
  std::vector<int64_t> out(static_cast<size_t>(context_ + 1));
  for (int64_t t = 0; t <= context_; ++t) out[static_cast<size_t>(t)] = token_at(m, first + t);
  return out;
}

void TokenShardSource::read(const std::vector<int64_t>& idx, int64_t begin, int64_t count, int64_t /*epoch*/,
                            Tensor& inputs, Tensor& labels) const {
  int64_t* x = inputs.data<int64_t>();
  int64_t* y = labels.data<int64_t>();
  const int64_t c = context_;
  for (int64_t r = 0; r < count; ++r) {
    const int64_t index = idx[static_cast<size_t>(begin + r)];
    MIX_CHECK(index >= 0 && index < size(), "token window " << index << " out of range [0, " << size() << ")");
    const size_t f = static_cast<size_t>(std::upper_bound(window_start_.begin(), window_start_.end(), index) -
                                         window_start_.begin() - 1);
    const Mapped& m = maps_[f];
    const int64_t first = (index - window_start_[f]) * c;
    int64_t prev = token_at(m, first);
    for (int64_t t = 0; t < c; ++t) {
      const int64_t next = token_at(m, first + t + 1);
      x[r * c + t] = prev;
      y[r * c + t] = next;
      prev = next;
    }
    const int64_t w = width_of(m.dtype);
    release(m, m.offset + first * w, m.offset + (first + c + 1) * w);
  }
}

namespace {

std::vector<std::string> matching(const std::vector<fs::path>& files, const std::string& part) {
  std::vector<std::string> out;
  for (const fs::path& p : files) {
    const std::string n = p.filename().string();
    if (p.extension() == ".bin" && n.find(part) != std::string::npos) out.push_back(p.string());
  }
  return out;
}

std::string list(const std::vector<std::string>& files) {
  std::string s;
  for (size_t i = 0; i < files.size() && i < 3; ++i) s += (i ? ", " : "") + files[i];
  if (files.size() > 3) s += ", ... (" + std::to_string(files.size()) + " files)";
  return s;
}

}  // namespace

TrainTest load_token_shards(const std::string& dir, int64_t context, int64_t vocab,
                            std::optional<TokenDType> token_dtype) {
  const std::string how =
      "write shards with scripts/make_token_shards.py, or point --data-dir at llm.c's "
      "*_train_*.bin and *_val_*.bin or nanoGPT's train.bin and val.bin";
  std::error_code ec;
  MIX_CHECK(fs::is_directory(dir, ec), "token data directory " << dir << " does not exist; " << how);
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());

  std::vector<std::string> train = matching(files, "_train_"), val = matching(files, "_val_");
  bool headerless = false;
  if (train.empty() && val.empty()) {
    const fs::path t = fs::path(dir) / "train.bin", v = fs::path(dir) / "val.bin";
    if (fs::is_regular_file(t, ec) || fs::is_regular_file(v, ec)) {
      headerless = true;
      MIX_CHECK(fs::is_regular_file(t, ec), "token data directory " << dir << " has val.bin but no train.bin; " << how);
      MIX_CHECK(fs::is_regular_file(v, ec), "token data directory " << dir << " has train.bin but no val.bin; " << how);
      train = {t.string()};
      val = {v.string()};
    }
  }
  MIX_CHECK(!train.empty() || !val.empty(), "token data directory " << dir << " holds no token files; " << how);
  MIX_CHECK(!train.empty(), "token data directory " << dir
                                                    << " has validation shards (*_val_*.bin) but no "
                                                       "training shards (*_train_*.bin); "
                                                    << how);
  MIX_CHECK(!val.empty(), "token data directory " << dir
                                                  << " has training shards (*_train_*.bin) but no "
                                                     "validation shards (*_val_*.bin); "
                                                  << how);

  auto split = [&](const std::vector<std::string>& paths, const std::string& what, const std::string& name) {
    auto source = std::make_shared<TokenShardSource>(paths, headerless, token_dtype, context, vocab);
    MIX_CHECK(source->size() > 0, "the " << what << " split of " << dir << " (" << list(paths) << ") holds "
                                         << source->tokens() << " tokens: too few for one window of " << context + 1
                                         << " tokens (--context + 1) in a file");
    Dataset ds;
    ds.name = name;
    ds.num_classes = vocab;
    ds.source = std::move(source);
    return ds;
  };
  return {split(train, "training", "token-shards"), split(val, "validation", "token-shards validation")};
}

}  // namespace mix::data
