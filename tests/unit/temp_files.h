// Files for tests: a scratch directory removed afterwards, whole-file reads
// and writes, and Debian's Python run on a script written into the directory.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace mix::test {

inline const char* const kPython = "/usr/bin/python3";

/// A fresh directory under the system temp dir, removed with its contents
/// (named by process and count, so parallel test programs never share one).
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("mix_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_bytes(const std::string& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Runs a Python script (written to a file, so no shell quoting) and returns its exit status.
inline int run_python(const TempDir& dir, const std::string& script, const std::string& args) {
  const std::string sp = dir.file("script.py");
  write_bytes(sp, script);
  const std::string cmd = std::string(kPython) + " " + sp + " " + args;
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace mix::test
