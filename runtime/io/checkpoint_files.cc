#include "runtime/io/checkpoint_files.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "runtime/core/check.h"

namespace mix::io {

namespace fs = std::filesystem;

namespace {

struct FileSummary {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

std::optional<FileSummary> summarize(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  FileSummary s;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  std::vector<char> buf(size_t{1} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
    s.bytes += static_cast<uint64_t>(n);
  }
  if (in.bad()) return std::nullopt;
  s.crc32 = static_cast<uint32_t>(crc);
  return s;
}

// STEM.step<N><EXT> beside `path` (model.safetensors -> model.step120.safetensors).
std::string history_path(const std::string& path, int64_t step) {
  const fs::path p(path);
  return (p.parent_path() / (p.stem().string() + ".step" + std::to_string(step) + p.extension().string())).string();
}

// Writes `text` to `path` through a temporary file renamed over it, synced.
void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) MIX_FAIL("cannot write " << path << ": cannot create " << tmp << ": " << std::strerror(errno));
  const char* c = text.data();
  size_t n = text.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      MIX_FAIL("cannot write " << tmp << ": " << std::strerror(err));
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  const bool synced = ::fsync(fd) == 0;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    MIX_FAIL("cannot write " << path << ": " << std::strerror(err));
  }
}

void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
}

}  // namespace

std::string completion_marker_path(const std::string& checkpoint) { return checkpoint + ".complete"; }

void write_completion_marker(const std::string& checkpoint, int64_t step) {
  const std::optional<FileSummary> s = summarize(checkpoint);
  MIX_CHECK(s, "cannot read back the checkpoint " << checkpoint << " just written, to mark it complete");
  std::ostringstream crc;
  crc << std::hex << s->crc32;
  const nlohmann::json marker = {{"file", fs::path(checkpoint).filename().string()},
                                 {"step", step},
                                 {"bytes", s->bytes},
                                 {"crc32", crc.str()}};
  write_file_atomically(completion_marker_path(checkpoint), marker.dump() + "\n");
}

std::optional<int64_t> complete_step(const std::string& checkpoint, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<int64_t> {
    if (why) *why = reason;
    return std::nullopt;
  };
  const std::string marker_file = completion_marker_path(checkpoint);
  std::ifstream in(marker_file);
  if (!in) return fail("it has no completion marker " + marker_file + " (its save was interrupted, or another "
                       "program wrote it)");
  nlohmann::json marker;
  try {
    in >> marker;
  } catch (const std::exception&) {
    return fail("its completion marker " + marker_file + " is not JSON");
  }
  const std::optional<FileSummary> s = summarize(checkpoint);
  if (!s) return fail("it cannot be read");
  try {
    std::ostringstream crc;
    crc << std::hex << s->crc32;
    if (marker.at("bytes").get<uint64_t>() != s->bytes || marker.at("crc32").get<std::string>() != crc.str())
      return fail("its size or CRC-32 differs from what its completion marker " + marker_file +
                  " recorded (a save was cut short, or the file was changed)");
    return marker.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception&) {
    return fail("its completion marker " + marker_file + " lacks a field (bytes, crc32 or step)");
  }
}

std::vector<CheckpointFile> checkpoint_history(const std::string& path) {
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  std::vector<CheckpointFile> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  const std::string prefix = p.stem().string() + ".step", ext = p.extension().string();
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() + ext.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - ext.size(), ext.size(), ext) != 0)
      continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - ext.size());
    if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    out.push_back({history_path(path, std::stoll(digits)), std::stoll(digits)});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointFile& a, const CheckpointFile& b) { return a.step < b.step; });
  return out;
}

void keep_previous_checkpoint(const std::string& path, int64_t keep) {
  if (keep <= 1) return;
  if (const std::optional<int64_t> step = complete_step(path)) {
    const std::string kept = history_path(path, *step);
    std::error_code ec;
    if (!fs::exists(kept, ec)) {
      // Links, not copies or renames: `path` stays whole until its
      // replacement is renamed over it, and the old bytes are not written twice.
      for (const auto& [from, to] : {std::pair{path, kept}, std::pair{completion_marker_path(path),
                                                                        completion_marker_path(kept)}}) {
        fs::create_hard_link(from, to, ec);
        if (ec) {
          ec.clear();
          fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
        }
        MIX_CHECK(!ec, "--keep-checkpoints: cannot keep " << from << " as " << to << ": " << ec.message());
      }
    }
  }
  std::vector<CheckpointFile> history = checkpoint_history(path);
  const size_t kept_in_history = static_cast<size_t>(keep - 1);
  for (size_t i = 0; i + kept_in_history < history.size(); ++i) {
    // The marker first: a file whose removal is interrupted is then never taken as complete.
    remove_quietly(completion_marker_path(history[i].path));
    remove_quietly(history[i].path);
  }
}

std::optional<CheckpointFile> newest_complete_checkpoint(const std::string& path, std::vector<std::string>* skipped) {
  std::vector<CheckpointFile> candidates = checkpoint_history(path);
  std::error_code ec;
  if (fs::exists(path, ec)) candidates.push_back({path, -1});
  std::optional<CheckpointFile> best;
  for (const CheckpointFile& c : candidates) {
    std::string why;
    const std::optional<int64_t> step = complete_step(c.path, &why);
    if (!step) {
      if (skipped) skipped->push_back(c.path + ": " + why);
      continue;
    }
    // On a tie the newest file, `path`, wins (it comes last).
    if (!best || *step >= best->step) best = CheckpointFile{c.path, *step};
  }
  return best;
}

}  // namespace mix::io
