#include "runtime/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/core/check.h"

namespace mix::io {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) MIX_FAIL("cannot write " << path_ << ": cannot create " << tmp_ << ": " << std::strerror(errno));
  crc_ = static_cast<uint32_t>(::crc32(0L, Z_NULL, 0));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::fail(const std::string& what) {
  const std::string reason = std::strerror(errno);
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  MIX_FAIL("cannot write " << path_ << ": " << what << " " << tmp_ << " failed: " << reason);
}

void AtomicFile::write(const void* data, size_t n) {
  const char* c = static_cast<const char*>(data);
  digest_.bytes += n;
  while (n > 0) {
    // One call at most 1 GiB: write(2) and zlib's uInt lengths both stay in range.
    const size_t part = std::min<size_t>(n, size_t{1} << 30);
    const ssize_t w = ::write(fd_, c, part);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("writing");
    }
    crc_ = static_cast<uint32_t>(::crc32(crc_, reinterpret_cast<const Bytef*>(c), static_cast<uInt>(w)));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

FileDigest AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("syncing");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp_.c_str());
    MIX_FAIL("cannot write " << path_ << ": closing " << tmp_ << " failed: " << reason);
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp_.c_str());
    MIX_FAIL("cannot write " << path_ << ": renaming " << tmp_ << " over it failed: " << reason);
  }
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  digest_.crc32 = crc_;
  return digest_;
}

}  // namespace mix::io
