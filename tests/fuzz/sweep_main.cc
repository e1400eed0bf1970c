// The sweep: a fuzz target run over fixed mutations of seed files, in every
// build (under ASan and UBSan in a sanitizer build), so that each reader's
// contract (fuzz_target.h) is checked by the test suite and not only in a
// fuzzing campaign. Deterministic: the same seeds give the same inputs.
//
//   fuzz_sweep_<target> SEED... [--max-random N]
//   fuzz_sweep_<target> --write-seeds DIR
//
// SEED is a file, or a folder whose files are all seeds; the seeds the target
// makes itself (own_seeds) come first. --write-seeds writes those into DIR
// (for libFuzzer's corpus) and sweeps nothing. For each seed it
// runs: the seed itself (which the reader must accept); truncations; at each byte position (every one in the
// first 2 KiB, then a spread), the byte with its lowest and highest bit
// flipped, and set to 0x00 and 0xFF; 4- and 8-byte windows set to boundary
// integers (0, the largest signed and unsigned, the smallest signed) at every
// 4-byte offset of the first 1 KiB; a byte inserted and one deleted; and N
// random mutations of 1 to 8 bytes each (default 256). A mutation that breaks
// the contract is printed with its description, and its input is written
// into the working folder as <target>-failure-K.bin (a crash or a hang:
// <target>-crash.bin) for a rerun (`fuzz_sweep_<target> FILE`, or
// libFuzzer's binary on it).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/unit/temp_files.h"

extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace {

namespace fs = std::filesystem;

// A mutation that hangs is a failure too: each input gets this long.
constexpr unsigned kSecondsPerInput = 20;

// What runs now, for the signal handlers: a crash or a hang names it and
// saves its input as <target>-crash.bin (the path made before any input runs).
char g_current[512] = "(nothing yet)";
const std::string* g_current_bytes = nullptr;
std::string g_crash_file;

void say_current() {
  const char* prefix = "\nfuzz sweep: the input that failed: ";
  (void)!::write(2, prefix, std::strlen(prefix));
  (void)!::write(2, g_current, std::strlen(g_current));
  if (g_current_bytes) {
    const int fd = ::open(g_crash_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      (void)!::write(fd, g_current_bytes->data(), g_current_bytes->size());
      ::close(fd);
      const char* saved = ", saved as ";
      (void)!::write(2, saved, std::strlen(saved));
      (void)!::write(2, g_crash_file.c_str(), g_crash_file.size());
    }
  }
  (void)!::write(2, "\n", 1);
}

void on_fatal_signal(int sig) {
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL, SIGALRM}) ::signal(s, SIG_DFL);
  if (sig == SIGALRM) {
    const char* text = "\nfuzz sweep: an input ran past its time limit (a hang)";
    (void)!::write(2, text, std::strlen(text));
  }
  say_current();
  ::raise(sig == SIGALRM ? SIGABRT : sig);
}

int g_failure_files = 0;  // inputs saved so far, numbering the next one's file

struct Sweep {
  std::string seed_name;
  int64_t inputs = 0;
  int64_t refused = 0;
  std::vector<std::string> failures;

  void run(const std::string& what, const std::string& bytes) {
    std::snprintf(g_current, sizeof g_current, "%s: %s (%zu bytes)", seed_name.c_str(), what.c_str(), bytes.size());
    g_current_bytes = &bytes;
    ::alarm(kSecondsPerInput);
    ++inputs;
    std::string broken;
    try {
      if (mix::fuzz::run_one(bytes) == mix::fuzz::Outcome::refused) ++refused;
    } catch (const std::exception& e) {
      broken = e.what();
    } catch (...) {
      broken = "an exception that is not a std::exception";
    }
    ::alarm(0);
    g_current_bytes = nullptr;
    if (broken.empty()) return;
    const std::string file =
        std::string(mix::fuzz::kTargetName) + "-failure-" + std::to_string(g_failure_files++) + ".bin";
    mix::test::write_bytes(file, bytes);
    failures.push_back(std::string(g_current) + ": " + broken + " (input saved as " + file + ")");
  }
};

// Positions to mutate: every one in the headers' range, then a spread.
std::vector<size_t> positions(size_t size) {
  std::vector<size_t> out;
  const size_t dense = std::min<size_t>(size, 2048);
  for (size_t i = 0; i < dense; ++i) out.push_back(i);
  const size_t spread = 512;
  if (size > dense)
    for (size_t k = 0; k < spread; ++k) out.push_back(dense + (size - dense) * k / spread);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void sweep_seed(Sweep& s, const std::string& seed, int max_random) {
  // A seed the reader refuses would make every mutation of it a refusal, and the sweep would test little.
  const int64_t refused_before = s.refused;
  s.run("the seed as it is", seed);
  if (s.refused > refused_before) s.failures.push_back(s.seed_name + ": the seed itself is refused; fix the seed");
  const size_t n = seed.size();

  std::vector<size_t> lengths;
  for (size_t len = 0; len < std::min<size_t>(n, 64); ++len) lengths.push_back(len);
  for (size_t k = 1; k < 64; ++k) lengths.push_back(n * k / 64);
  if (n > 0) lengths.push_back(n - 1);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  for (size_t len : lengths)
    if (len < n) s.run("cut to " + std::to_string(len) + " bytes", seed.substr(0, len));

  for (size_t i : positions(n)) {
    const auto byte = static_cast<unsigned char>(seed[i]);
    const std::pair<const char*, unsigned char> changes[] = {
        {"lowest bit flipped", static_cast<unsigned char>(byte ^ 0x01)},
        {"highest bit flipped", static_cast<unsigned char>(byte ^ 0x80)},
        {"set to 0x00", 0x00},
        {"set to 0xff", 0xff}};
    for (const auto& [what, value] : changes) {
      if (value == byte) continue;
      std::string m = seed;
      m[i] = static_cast<char>(value);
      s.run("byte " + std::to_string(i) + " " + what, m);
    }
  }

  const uint64_t boundaries[] = {0, INT32_MAX, uint64_t{1} << 31, UINT32_MAX, INT64_MAX, uint64_t{1} << 63, UINT64_MAX};
  for (size_t at = 0; at < std::min<size_t>(n, 1024); at += 4)
    for (size_t width : {4, 8})
      for (uint64_t v : boundaries) {
        if (at + width > n || (width == 4 && v > 0xffffffffull)) continue;
        std::string m = seed;
        for (size_t b = 0; b < width; ++b) m[at + b] = static_cast<char>((v >> (8 * b)) & 0xff);  // little-endian
        std::ostringstream what;
        what << width << " bytes at " << at << " set to 0x" << std::hex << v;
        s.run(what.str(), m);
      }

  for (size_t k = 0; k < 16 && n > 0; ++k) {
    const size_t at = n * k / 16;
    s.run("byte 0x00 inserted at " + std::to_string(at), seed.substr(0, at) + '\0' + seed.substr(at));
    s.run("byte " + std::to_string(at) + " deleted", seed.substr(0, at) + seed.substr(at + 1));
  }

  std::mt19937_64 rng(std::hash<std::string>{}(s.seed_name));
  for (int r = 0; r < max_random && n > 0; ++r) {
    std::string m = seed;
    const int count = 1 + static_cast<int>(rng() % 8);
    for (int c = 0; c < count; ++c) m[rng() % n] = static_cast<char>(rng() & 0xff);
    s.run("random mutation " + std::to_string(r) + " (" + std::to_string(count) + " bytes)", m);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int max_random = 256;
  std::vector<std::pair<std::string, std::string>> seeds;  // name, bytes
  if (mix::fuzz::own_seeds) seeds = mix::fuzz::own_seeds();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--max-random" && i + 1 < argc) {
      max_random = std::stoi(argv[++i]);
    } else if (arg == "--write-seeds" && i + 1 < argc) {
      const fs::path dir = argv[++i];
      fs::create_directories(dir);
      for (const auto& [name, bytes] : seeds) mix::test::write_bytes((dir / name).string(), bytes);
      return 0;
    } else if (fs::is_directory(arg)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(arg))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) seeds.emplace_back(f.filename().string(), mix::test::read_bytes(f.string()));
    } else if (fs::is_regular_file(arg)) {
      seeds.emplace_back(fs::path(arg).filename().string(), mix::test::read_bytes(arg));
    } else {
      std::cerr << "fuzz sweep: " << arg << " is neither a seed file nor a folder of seeds\n";
      return 2;
    }
  }
  if (seeds.empty()) {
    std::cerr << "fuzz sweep: no seeds (usage: " << argv[0]
              << " SEED_FILE_OR_FOLDER... [--max-random N], or --write-seeds DIR)\n";
    return 2;
  }
  g_crash_file = std::string(mix::fuzz::kTargetName) + "-crash.bin";
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL, SIGALRM}) ::signal(sig, on_fatal_signal);
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(say_current);

  int64_t inputs = 0, refused = 0;
  std::vector<std::string> failures;
  for (const auto& [name, bytes] : seeds) {
    Sweep s;
    s.seed_name = name;
    sweep_seed(s, bytes, max_random);
    std::cout << mix::fuzz::kTargetName << ": " << s.seed_name << ": " << s.inputs << " inputs, " << s.refused
              << " refused, " << s.failures.size() << " broke the contract\n";
    inputs += s.inputs;
    refused += s.refused;
    failures.insert(failures.end(), s.failures.begin(), s.failures.end());
  }
  for (const std::string& f : failures) std::cout << "FAILED " << f << "\n";
  std::cout << mix::fuzz::kTargetName << ": " << seeds.size() << " seed(s), " << inputs << " inputs, " << refused
            << " refused, " << failures.size() << " broke the contract\n";
  return failures.empty() ? 0 : 1;
}
