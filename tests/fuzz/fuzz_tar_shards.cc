// WebDataset tar shards (--data-format shards): the index and every member.
#include "runtime/data/tar_index.h"
#include "tests/fuzz/fuzz_files.h"
#include "tests/unit/tar_header.h"

namespace mix::fuzz {

const char* const kTargetName = "tar_shards";

namespace {

// Header checksums set right in every 512-byte block that carries the ustar
// magic, so that mutations reach the fields behind the checksum (a mutation
// that breaks the magic leaves that block's checksum as it was, so the
// checksum's own refusal is still fuzzed).
std::string with_checksums(std::string tar) {
  for (size_t at = 0; at + 512 <= tar.size(); at += 512) {
    char* h = tar.data() + at;
    if (std::string(h + 257, 5) == "ustar") test::set_tar_checksum(h);
  }
  return tar;
}

}  // namespace

Outcome run_one(const std::string& bytes) {
  const std::string path = write_input("train-000000.tar", with_checksums(bytes));
  return refused_naming(path, [&] {
    const data::TarIndex index = data::index_tar_shards({path});
    for (const data::TarSample& s : index.samples)
      for (const auto& [extension, span] : s.members) {
        if (span.offset + span.size > bytes.size() || span.offset + span.size < span.offset)
          throw ContractBroken("member " + s.key + "." + extension + " lies past the shard's end");
        if (data::read_tar_member(path, span).size() != span.size)
          throw ContractBroken("member " + s.key + "." + extension + " read back at another size");
      }
  });
}

}  // namespace mix::fuzz
