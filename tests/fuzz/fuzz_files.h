// What the fuzz targets share: a scratch folder of the process's own (in
// memory where /dev/shm exists, since every input is written to a file), and
// the check that a refusal names the file.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "runtime/core/check.h"
#include "tests/fuzz/fuzz_target.h"

namespace mix::fuzz {

/// A reader broke the contract of fuzz_target.h without crashing.
struct ContractBroken : std::logic_error {
  using std::logic_error::logic_error;
};

/// The process's scratch folder, made on first use and removed at exit.
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      const std::filesystem::path base =
          std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
      path = base / ("mix_fuzz_" + std::to_string(::getpid()));
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

/// Writes `bytes` to `name` in the scratch folder and returns its path.
inline std::string write_input(const std::string& name, const std::string& bytes) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("fuzz: cannot write " + path);
  return path;
}

/// Runs `read` (a reader given the file `path`): accepted when it returns,
/// refused when it throws mix::Error naming `path`; a mix::Error that does
/// not name it breaks the contract, and any other exception goes on out.
template <class Read>
Outcome refused_naming(const std::string& path, Read&& read) {
  try {
    read();
    return Outcome::accepted;
  } catch (const Error& e) {
    if (std::string(e.what()).find(path) == std::string::npos)
      throw ContractBroken("the error does not name the file " + path + ": " + e.what());
    return Outcome::refused;
  }
}

}  // namespace mix::fuzz
