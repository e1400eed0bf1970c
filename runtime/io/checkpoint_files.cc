#include "runtime/io/checkpoint_files.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/core/check.h"

namespace mix::io {

namespace fs = std::filesystem;

namespace {

std::optional<FileDigest> digest_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  FileDigest s;
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

void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
}

std::string hex(uint32_t v) {
  std::ostringstream o;
  o << std::hex << v;
  return o.str();
}

// The marker of `checkpoint` as JSON, or null when it is missing or not JSON.
nlohmann::json read_marker(const std::string& checkpoint) {
  std::ifstream in(completion_marker_path(checkpoint));
  if (!in) return nullptr;
  try {
    nlohmann::json marker;
    in >> marker;
    return marker;
  } catch (const std::exception&) {
    return nullptr;
  }
}

// The step a marker names, unchecked against the file: what ordering and
// history need, without reading the checkpoint.
std::optional<int64_t> marked_step(const std::string& checkpoint) {
  const nlohmann::json marker = read_marker(checkpoint);
  if (!marker.is_object() || !marker.contains("step") || !marker["step"].is_number_integer()) return std::nullopt;
  return marker["step"].get<int64_t>();
}

}  // namespace

std::string completion_marker_path(const std::string& checkpoint) { return checkpoint + ".complete"; }

void write_completion_marker(const std::string& checkpoint, int64_t step, const FileDigest& digest) {
  const nlohmann::json marker = {{"file", fs::path(checkpoint).filename().string()},
                                 {"step", step},
                                 {"bytes", digest.bytes},
                                 {"crc32", hex(digest.crc32)}};
  const std::string text = marker.dump() + "\n";
  AtomicFile file(completion_marker_path(checkpoint));
  file.write(text.data(), text.size());
  file.commit();
}

std::optional<int64_t> complete_step(const std::string& checkpoint, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<int64_t> {
    if (why) *why = reason;
    return std::nullopt;
  };
  const std::string marker_file = completion_marker_path(checkpoint);
  if (!fs::exists(marker_file))
    return fail("it has no completion marker " + marker_file + " (its save was interrupted, or another program "
                "wrote it)");
  const nlohmann::json marker = read_marker(checkpoint);
  if (marker.is_null()) return fail("its completion marker " + marker_file + " is not JSON");
  const std::optional<FileDigest> s = digest_of(checkpoint);
  if (!s) return fail("it cannot be read");
  try {
    if (marker.at("bytes").get<uint64_t>() != s->bytes || marker.at("crc32").get<std::string>() != hex(s->crc32))
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
  // The marker's step names the history file; the file is not read (a
  // damaged one is passed over by --resume auto, which checks its CRC-32).
  if (const std::optional<int64_t> step = marked_step(path)) {
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

void save_checkpoint_keeping(const std::string& path, const Program& p, const Scope& scope, const Metadata& meta,
                             int64_t step, int64_t keep) {
  keep_previous_checkpoint(path, keep);
  write_completion_marker(path, step, save_checkpoint(path, p, scope, meta));
}

std::optional<CheckpointFile> newest_complete_checkpoint(const std::string& path, std::vector<std::string>* skipped) {
  std::vector<CheckpointFile> candidates = checkpoint_history(path);
  std::error_code ec;
  if (fs::exists(path, ec)) candidates.push_back({path, 0});
  // Newest first by what the markers say, `path` first on a tie (it is the
  // newest file); a file without a readable marker goes last, to be reported.
  for (CheckpointFile& c : candidates) c.step = marked_step(c.path).value_or(-1);
  std::stable_sort(candidates.begin(), candidates.end(), [&](const CheckpointFile& a, const CheckpointFile& b) {
    return a.step != b.step ? a.step > b.step : a.path == path && b.path != path;
  });
  for (const CheckpointFile& c : candidates) {
    std::string why;
    if (const std::optional<int64_t> step = complete_step(c.path, &why)) return CheckpointFile{c.path, *step};
    if (skipped) skipped->push_back(c.path + ": " + why);
  }
  return std::nullopt;
}

}  // namespace mix::io
