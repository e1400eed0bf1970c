// An image folder's cached listing (<data>/.mixtrain-index-<split>.txt,
// runtime/data/image_folder.h): a damaged cache must never stop a run or
// change what the listing can hold; it is read, or ignored and the folder
// walked again. The folder itself is always whole here, so any error breaks
// the contract. Every folder's time is one fixed instant, which the inputs
// write as "@T@" (so that a seed's times stay right on any machine).
#include <chrono>
#include <fstream>

#include "runtime/data/image_folder.h"
#include "tests/fuzz/fuzz_files.h"
#include "tests/unit/temp_files.h"

namespace mix::fuzz {

const char* const kTargetName = "image_index";

namespace {

namespace fs = std::filesystem;

struct Folder {
  fs::path split;
  fs::path cache;
  std::string time_text;  // the folders' fixed time, as the cache writes it
};

const Folder& folder() {
  static const Folder f = [] {
    Folder out;
    const fs::path data = scratch_dir() / "images";
    out.split = data / "train";
    out.cache = data / ".mixtrain-index-train.txt";
    for (const char* file : {"cat/a.jpg", "cat/b.png", "dog/c.jpeg", "dog/sub/d.jpg"}) {
      fs::create_directories((out.split / file).parent_path());
      std::ofstream(out.split / file) << "not decoded by a listing";
    }
    // Long past, so that the listing is cached (a folder changed in the last seconds is not).
    const auto when = fs::file_time_type::clock::now() - std::chrono::hours(24 * 365);
    for (const char* dir : {".", "cat", "dog", "dog/sub"}) fs::last_write_time(out.split / dir, when);
    out.time_text = std::to_string(when.time_since_epoch().count());
    return out;
  }();
  return f;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> own_seeds() {
  const Folder& f = folder();
  fs::remove(f.cache);
  data::list_image_folder(f.split.string());  // walks, and writes the cache
  return {{"listing.txt", replaced(test::read_bytes(f.cache.string()), f.time_text, "@T@")}};
}

Outcome run_one(const std::string& bytes) {
  const Folder& f = folder();
  write_input(fs::relative(f.cache, scratch_dir()).string(), replaced(bytes, "@T@", f.time_text));
  data::ImageFolderIndex index;
  try {
    index = data::list_image_folder(f.split.string());
  } catch (const Error& e) {
    throw ContractBroken(std::string("a damaged cache stopped the listing of a whole folder: ") + e.what());
  }
  if (index.classes.empty() || index.files.empty() || index.files.size() != index.class_of.size())
    throw ContractBroken("a listing of " + std::to_string(index.classes.size()) + " classes and " +
                         std::to_string(index.files.size()) + " files");
  for (int64_t c : index.class_of)
    if (c < 0 || c >= static_cast<int64_t>(index.classes.size()))
      throw ContractBroken("a file of class " + std::to_string(c) + " among " + std::to_string(index.classes.size()));
  return index.from_cache ? Outcome::accepted : Outcome::refused;
}

}  // namespace mix::fuzz
