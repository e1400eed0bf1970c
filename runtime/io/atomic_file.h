#pragma once
// A file written whole or not at all: the bytes go to PATH.tmp, commit()
// syncs it, renames it over PATH and syncs the folder, so a crash never leaves
// a half-written file under the final name. Checkpoints and their completion
// markers are written through it.
#include <cstddef>
#include <cstdint>
#include <string>

namespace mix::io {

/// What a file written holds: its size and zlib's CRC-32 of its bytes.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

class AtomicFile {
 public:
  /// Creates PATH.tmp; throws mix::Error "cannot write PATH: cannot create PATH.tmp: REASON".
  explicit AtomicFile(std::string path);
  /// Uncommitted (an error on the way): removes PATH.tmp; PATH is untouched.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends `n` bytes; the digest follows them.
  void write(const void* data, size_t n);
  /// Syncs, closes and renames PATH.tmp over PATH, then syncs the folder (best
  /// effort: some file systems refuse that). Returns the digest of the file.
  FileDigest commit();

 private:
  [[noreturn]] void fail(const std::string& what);
  std::string path_, tmp_;
  int fd_ = -1;
  uint32_t crc_ = 0;
  FileDigest digest_;
};

}  // namespace mix::io
