#include "runtime/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/core/check.h"
#include "runtime/io/atomic_file.h"

namespace mix::io {

namespace {

// The reference implementation refuses headers above 100 MB; so do we, so that a
// corrupt length cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

const char* const kSupported = "F32, F16, BF16, I32, I64, U8";

std::string errno_text() { return std::strerror(errno); }

// Closes a FILE* on every path out of a function.
struct FileCloser {
  std::FILE* f;
  ~FileCloser() {
    if (f) std::fclose(f);
  }
};

bool parse_safetensors_dtype(const std::string& s, DType& out) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    if (s == dtype_safetensors_name(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!v.is_object()) MIX_FAIL(where << " is not a JSON object in the header");
  // The format gives a tensor these three fields and no others (the reference
  // reader refuses the rest): an unknown one is damage or another format, and
  // whatever it was meant to say about the data would be ignored.
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      MIX_FAIL(where << " has a field \"" << it.key()
                     << "\" that safetensors does not have (a tensor has only dtype, shape and data_offsets; other "
                        "information belongs in \"__metadata__\")");
  Entry e;
  e.name = name;

  auto dt = v.find("dtype");
  if (dt == v.end()) MIX_FAIL(where << " has no \"dtype\" in the header");
  if (!dt->is_string()) MIX_FAIL(where << ": \"dtype\" is not a string");
  const std::string dts = dt->get<std::string>();
  if (!parse_safetensors_dtype(dts, e.dtype))
    MIX_FAIL(where << " has dtype " << dts << ", which mixtrain does not support (supported: " << kSupported
                   << "); convert it before saving (e.g. tensor.float() or tensor.long())");

  auto sh = v.find("shape");
  if (sh == v.end()) MIX_FAIL(where << " has no \"shape\" in the header");
  if (!sh->is_array()) MIX_FAIL(where << ": \"shape\" is not an array");
  // numel * element size must fit in 64 bits; track it as we go.
  uint64_t bytes = dtype_size(e.dtype);
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned())  // the parser stores every non-negative integer as unsigned
      MIX_FAIL(where << ": shape " << sh->dump() << " has an entry that is not a non-negative integer");
    const uint64_t n = d.get<uint64_t>();
    if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      MIX_FAIL(where << ": shape " << sh->dump() << " is too large");
    if (n != 0 && bytes > std::numeric_limits<uint64_t>::max() / n)
      MIX_FAIL(where << ": shape " << sh->dump() << " is too large");
    bytes *= n;
    e.shape.push_back(static_cast<int64_t>(n));
  }

  auto off = v.find("data_offsets");
  if (off == v.end()) MIX_FAIL(where << " has no \"data_offsets\" in the header");
  if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
    MIX_FAIL(where << ": \"data_offsets\" " << off->dump() << " is not a pair of non-negative integers");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.end < e.begin) MIX_FAIL(where << ": data_offsets " << off->dump() << " end before they begin");
  if (e.end - e.begin != bytes)
    MIX_FAIL(where << ": data_offsets " << off->dump() << " span " << (e.end - e.begin) << " bytes but "
                   << dts << " " << shape_str(e.shape) << " needs " << bytes);
  return e;
}

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) MIX_FAIL("cannot open checkpoint/data file " << path << ": " << errno_text());
  FileCloser closer{f};

  struct stat st {};
  if (fstat(fileno(f), &st) != 0) MIX_FAIL("cannot stat " << path << ": " << errno_text());
  if (S_ISDIR(st.st_mode)) MIX_FAIL("cannot read checkpoint/data file " << path << ": it is a directory");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8)
    MIX_FAIL(path << " is not a safetensors file: it has " << file_size
                  << " bytes, fewer than the 8-byte header length that starts one");

  unsigned char len_bytes[8];
  if (std::fread(len_bytes, 1, 8, f) != 8) MIX_FAIL("cannot read " << path << ": " << errno_text());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];  // little-endian
  if (header_len > file_size - 8)
    MIX_FAIL(path << " is truncated or not a safetensors file: its header length " << header_len
                  << " is larger than the " << (file_size - 8) << " bytes after the length field");
  if (header_len > kMaxHeaderBytes)
    MIX_FAIL(path << ": header of " << header_len << " bytes exceeds the " << kMaxHeaderBytes << "-byte limit");

  std::string header(header_len, '\0');
  if (header_len && std::fread(header.data(), 1, header_len, f) != header_len)
    MIX_FAIL("cannot read the header of " << path << ": " << errno_text());

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);  // trailing padding spaces are whitespace
  } catch (const nlohmann::json::exception& e) {
    MIX_FAIL(path << ": the safetensors header is not valid JSON (" << e.what() << ")");
  }
  if (!j.is_object()) MIX_FAIL(path << ": the safetensors header is not a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) MIX_FAIL(path << ": \"__metadata__\" is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          MIX_FAIL(path << ": metadata value for '" << m.key() << "' is not a string (safetensors metadata is "
                        << "string to string)");
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    Entry e = parse_entry(path, it.key(), *it);
    if (e.end > data_size)
      MIX_FAIL(path << " is truncated: tensor '" << e.name << "' needs data bytes [" << e.begin << ", " << e.end
                    << ") but the file has only " << data_size << " bytes of data");
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    // An empty tensor at an offset comes before the tensor whose data starts there.
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end != b.end ? a.end < b.end : a.name < b.name;
  });
  // Each byte of data belongs to exactly one tensor, in offset order, as the
  // format requires: overlapping ranges would load one tensor's bytes as
  // another's, and bytes no tensor owns (a hole, or data after the last
  // tensor's) mean the header and the data disagree, a sign of damage or of a
  // file that was appended to. An empty tensor sits at the offset reached.
  const Entry* last = nullptr;  // the tensor whose data ends at `reached`
  uint64_t reached = 0;
  for (const Entry& e : entries) {
    if (e.begin < reached)
      MIX_FAIL(path << " is corrupt: tensors '" << last->name << "' (data bytes [" << last->begin << ", " << last->end
                    << ")) and '" << e.name << "' ([" << e.begin << ", " << e.end << ")) overlap");
    if (e.begin > reached)
      MIX_FAIL(path << " is corrupt: data bytes [" << reached << ", " << e.begin << ") belong to no tensor (a hole "
                    << (last ? "between tensors '" + last->name + "' and '" + e.name + "'"
                             : "before tensor '" + e.name + "'")
                    << "); safetensors data holds the tensors back to back");
    if (e.end > e.begin) last = &e;
    reached = e.end;
  }
  if (reached != data_size)
    MIX_FAIL(path << " is corrupt: it has " << (data_size - reached)
                  << " bytes after the last tensor's data (data bytes [" << reached << ", " << data_size
                  << ") belong to no tensor); a safetensors file ends where its last tensor does, so the header and "
                     "the data disagree (a damaged file, or one with bytes appended)");

  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    const uint64_t n = e.end - e.begin;
    if (n) {
      if (fseeko(f, static_cast<off_t>(data_start + e.begin), SEEK_SET) != 0 ||
          std::fread(t.raw(), 1, n, f) != n)
        MIX_FAIL("cannot read tensor '" << e.name << "' from " << path << ": "
                                        << (std::ferror(f) ? errno_text() : std::string("unexpected end of file")));
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

FileDigest write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Validate everything before creating any file.
  std::set<std::string> seen;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) MIX_FAIL("cannot write " << path << ": a tensor has an empty name");
    if (name == "__metadata__") MIX_FAIL("cannot write " << path << ": '__metadata__' is reserved, not a tensor name");
    if (!seen.insert(name).second) MIX_FAIL("cannot write " << path << ": tensor name '" << name << "' appears twice");
    if (!t.defined()) MIX_FAIL("cannot write " << path << ": tensor '" << name << "' is undefined");
    if (t.device().kind != DeviceKind::cpu)
      MIX_FAIL("cannot write " << path << ": tensor '" << name << "' is on " << t.device().str()
                               << "; copy it to the host first");
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(dtype_safetensors_name(t.dtype()));
    e["shape"] = t.shape();
    e["data_offsets"] = {offset, offset + t.bytes()};
    header[name] = std::move(e);
    offset += t.bytes();
  }
  std::string text = header.dump();
  // Pad so that the data starts 8-byte aligned (the length field is 8 bytes).
  text.append((8 - text.size() % 8) % 8, ' ');

  AtomicFile file(path);
  unsigned char len_bytes[8];
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>((len >> (8 * i)) & 0xff);
  file.write(len_bytes, 8);
  file.write(text.data(), text.size());
  for (const auto& [name, t] : tensors) {
    if (t.bytes()) file.write(t.raw(), t.bytes());
  }
  return file.commit();
}

void check_writable(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    MIX_FAIL("cannot write " << path << ": it is a folder; name a file in it");
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const bool created = fd >= 0;
  if (!created && errno == EEXIST) fd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC);  // an earlier run's leftover
  if (fd < 0) MIX_FAIL("cannot write " << path << ": cannot create " << tmp << ": " << errno_text());
  ::close(fd);
  if (created) ::unlink(tmp.c_str());
}

}  // namespace mix::io
