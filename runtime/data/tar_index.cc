#include "runtime/data/tar_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/core/check.h"

namespace mix::data {

namespace {

constexpr uint64_t kBlock = 512;

// Closes the file on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly `n` bytes at `offset`; false at end of file.
bool read_at(int fd, void* buf, size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) MIX_FAIL("cannot read " << path << " at byte " << offset + done << ": " << std::strerror(errno));
    if (r == 0) return false;
    done += static_cast<size_t>(r);
  }
  return true;
}

// A header's numeric field: octal text, or GNU's base-256 for large sizes
// (first byte 0x80, then the number big-endian; 0xff would start a negative
// one). A number that does not fit in 63 bits is no size of a real file, and
// would wrap the offsets computed from it: not ok.
uint64_t header_number(const unsigned char* field, size_t width, bool* ok) {
  if (field[0] & 0x80) {
    if (field[0] != 0x80) *ok = false;
    uint64_t v = 0;
    for (size_t i = 1; i < width; ++i) {
      if (v >> 55) {
        *ok = false;
        return 0;
      }
      v = (v << 8) | field[i];
    }
    return v;
  }
  uint64_t v = 0;
  size_t i = 0;
  while (i < width && (field[i] == ' ' || field[i] == '\0')) ++i;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i) v = v * 8 + (field[i] - '0');
  for (; i < width; ++i)
    if (field[i] != ' ' && field[i] != '\0') *ok = false;
  return v;
}

// The checksum is the byte sum of the header with its own field read as spaces.
bool checksum_matches(const unsigned char* h) {
  bool ok = true;
  const uint64_t stored = header_number(h + 148, 8, &ok);
  uint64_t sum = 0;
  for (size_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  return ok && sum == stored;
}

std::string field_text(const unsigned char* field, size_t width) {
  const auto* c = reinterpret_cast<const char*>(field);
  return std::string(c, strnlen(c, width));
}

// The `path` record of a pax extended header ("LEN path=VALUE\n" records).
std::string pax_path(const std::string& records) {
  size_t at = 0;
  while (at < records.size()) {
    const size_t space = records.find(' ', at);
    if (space == std::string::npos) break;
    const size_t len = std::strtoull(records.c_str() + at, nullptr, 10);
    // A record's length counts its digits, space, text and newline.
    if (len > records.size() - at || space + 1 >= at + len) break;
    const std::string record = records.substr(space + 1, at + len - space - 2);  // without the newline
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    at += len;
  }
  return "";
}

// WebDataset's split of a member name: the key is the name up to the first
// dot of its last path component; the extension is the rest.
std::pair<std::string, std::string> key_and_extension(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) return {name, ""};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

void index_shard(const std::string& path, int32_t shard, std::vector<TarSample>& samples) {
  Fd file;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd < 0) MIX_FAIL("cannot open the shard " << path << ": " << std::strerror(errno));
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) MIX_FAIL("cannot stat the shard " << path << ": " << std::strerror(errno));
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  unsigned char h[kBlock];
  uint64_t offset = 0;
  std::string long_name;  // from a GNU 'L' or pax 'x' header, for the next member
  bool ended = false;
  while (read_at(file.fd, h, kBlock, offset, path)) {
    if (std::all_of(h, h + kBlock, [](unsigned char b) { return b == 0; })) {
      ended = true;  // the first of the two zero blocks that end an archive
      break;
    }
    if (!checksum_matches(h))
      MIX_FAIL("the shard " << path << " is not a tar archive, or is damaged: the header at byte " << offset
                            << " fails its checksum");
    bool ok = true;
    const uint64_t size = header_number(h + 124, 12, &ok);
    const char type = static_cast<char>(h[156]);
    const uint64_t data = offset + kBlock;  // within the file: the header was read whole
    if (!ok)
      MIX_FAIL("the shard " << path << " is damaged: the header at byte " << offset << " (" << field_text(h, 100)
                            << ") has a size field that is not a tar number, or is too large for any file");
    if (size > file_size - data)
      MIX_FAIL("the shard " << path << " is cut short: the member at byte " << offset << " ("
                            << field_text(h, 100) << ", " << size << " bytes) runs past its end (" << file_size
                            << " bytes)");
    if (type == 'L' || type == 'x') {
      std::string text(size, '\0');
      read_at(file.fd, text.data(), size, data, path);
      long_name = type == 'L' ? std::string(text.c_str()) : pax_path(text);
    } else if (type == '0' || type == '\0' || type == '7') {
      std::string name = long_name;
      if (name.empty()) {
        const std::string prefix = field_text(h + 345, 155);
        name = (prefix.empty() ? "" : prefix + "/") + field_text(h, 100);
      }
      long_name.clear();
      auto [key, extension] = key_and_extension(name);
      if (samples.empty() || samples.back().shard != shard || samples.back().key != key)
        samples.push_back(TarSample{shard, key, {}});
      samples.back().members[extension] = {data, size};
    } else {
      long_name.clear();  // directories, links and the like carry no sample data
    }
    offset = data + (size + kBlock - 1) / kBlock * kBlock;
  }
  if (!ended)
    MIX_FAIL("the shard " << path << " is cut short: it ends at byte " << offset
                          << " without the zero blocks that end a tar archive");
}

}  // namespace

TarIndex index_tar_shards(const std::vector<std::string>& shards) {
  TarIndex index;
  index.shards = shards;
  for (size_t i = 0; i < shards.size(); ++i) index_shard(shards[i], static_cast<int32_t>(i), index.samples);
  return index;
}

std::vector<uint8_t> read_tar_member(const std::string& shard, const TarMemberSpan& span) {
  Fd file;
  file.fd = ::open(shard.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd < 0) MIX_FAIL("cannot open the shard " << shard << ": " << std::strerror(errno));
  std::vector<uint8_t> bytes(span.size);
  if (!read_at(file.fd, bytes.data(), span.size, span.offset, shard))
    MIX_FAIL("the shard " << shard << " is cut short: the member at byte " << span.offset << " runs past its end");
  return bytes;
}

}  // namespace mix::data
