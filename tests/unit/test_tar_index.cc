// WebDataset tar shards indexed for random access: shards written by Python's
// tarfile (ustar, GNU and pax formats, long names) index into the samples and
// member bytes Python put there; damaged shards are errors naming the shard.
#include <catch2/catch.hpp>
#include <string>

#include "runtime/core/check.h"
#include "runtime/data/tar_index.h"
#include "tests/unit/tar_header.h"
#include "tests/unit/temp_files.h"

using Catch::Matchers::Contains;
using namespace mix::data;
using namespace mix::test;

namespace {

// Writes shard ARGV[1] in tarfile format ARGV[2]: three samples of a .jpg and
// a .cls each (the .jpg bytes are the key repeated, so each is checkable),
// the third with a name longer than a ustar header holds, and a directory.
const char* kWriter = R"(
import io, sys, tarfile
fmt = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}[sys.argv[2]]
keys = ["a/img0", "a/img1", "a/" + "long" * 30 + "_img2"]
if fmt == tarfile.USTAR_FORMAT:
    keys[2] = "a/img2"  # ustar cannot hold a 120-character name without a '/' split
with tarfile.open(sys.argv[1], "w", format=fmt) as t:
    d = tarfile.TarInfo("a"); d.type = tarfile.DIRTYPE; t.addfile(d)
    for i, k in enumerate(keys):
        for ext, data in (("jpg", (k * 50).encode()), ("cls", str(i % 2).encode())):
            info = tarfile.TarInfo(f"{k}.{ext}"); info.size = len(data)
            t.addfile(info, io.BytesIO(data))
print(",".join(keys))
)";

std::string text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace

TEST_CASE("tar shards from Python's tarfile index into their samples, in every format", "[data][tar]") {
  for (const char* format : {"ustar", "gnu", "pax"}) {
    DYNAMIC_SECTION(format) {
      TempDir dir;
      const std::string shard = dir.file("train-000000.tar");
      REQUIRE(run_python(dir, kWriter, shard + " " + format + " > " + dir.file("keys.txt")) == 0);
      std::string keys = read_bytes(dir.file("keys.txt"));
      keys.erase(keys.find_last_not_of('\n') + 1);
      const TarIndex index = index_tar_shards({shard});
      REQUIRE(index.samples.size() == 3);
      size_t from = 0;
      for (size_t i = 0; i < 3; ++i) {
        const size_t comma = std::min(keys.find(',', from), keys.size());
        const std::string key = keys.substr(from, comma - from);
        from = comma + 1;
        const TarSample& s = index.samples[i];
        CHECK(s.key == key);
        REQUIRE(s.members.count("jpg") == 1);
        REQUIRE(s.members.count("cls") == 1);
        std::string expected;
        for (int r = 0; r < 50; ++r) expected += key;
        CHECK(text(read_tar_member(shard, s.members.at("jpg"))) == expected);
        CHECK(text(read_tar_member(shard, s.members.at("cls"))) == std::to_string(i % 2));
      }
    }
  }
}

TEST_CASE("samples keep their shard, in shard order", "[data][tar]") {
  TempDir dir;
  const std::string a = dir.file("train-000000.tar"), b = dir.file("train-000001.tar");
  REQUIRE(run_python(dir, kWriter, a + " gnu > /dev/null") == 0);
  REQUIRE(run_python(dir, kWriter, b + " ustar > /dev/null") == 0);
  const TarIndex index = index_tar_shards({a, b});
  REQUIRE(index.samples.size() == 6);
  CHECK(index.samples[2].shard == 0);
  CHECK(index.samples[3].shard == 1);
  CHECK(index.samples[3].key == "a/img0");
}

TEST_CASE("damaged shards are errors naming the shard and where", "[data][tar]") {
  TempDir dir;
  const std::string shard = dir.file("train-000000.tar");
  REQUIRE(run_python(dir, kWriter, shard + " gnu > /dev/null") == 0);
  const std::string good = read_bytes(shard);

  SECTION("cut short inside a member") {
    write_bytes(shard, good.substr(0, 512 * 3 + 100));
    REQUIRE_THROWS_WITH(index_tar_shards({shard}), Contains(shard) && Contains("cut short"));
  }
  SECTION("cut short before its end blocks") {
    // Every member whole, the two zero blocks (and tarfile's padding) gone.
    const TarIndex whole = index_tar_shards({shard});
    const TarMemberSpan last = whole.samples.back().members.at("cls");
    write_bytes(shard, good.substr(0, (last.offset + last.size + 511) / 512 * 512));
    REQUIRE_THROWS_WITH(index_tar_shards({shard}), Contains(shard) && Contains("without the zero blocks"));
  }
  SECTION("a flipped byte in a header") {
    std::string bad = good;
    bad[512 + 10] = static_cast<char>(bad[512 + 10] ^ 1);  // the second header's name
    write_bytes(shard, bad);
    REQUIRE_THROWS_WITH(index_tar_shards({shard}), Contains(shard) && Contains("checksum") && Contains("byte 512"));
  }
  SECTION("a base-256 size too large for any file, with a right checksum") {
    // 2^64 - 512 once wrapped to 64 bits: before the reader refused such
    // sizes, the member's end wrapped below the file's size and the next
    // header's offset came back to this one, so indexing never ended.
    std::string bad = good;
    const size_t header = 512;  // the second member's header
    const std::string size_field = std::string("\x80", 1) + std::string(9, '\xff') + std::string("\xfe\x00", 2);
    bad.replace(header + 124, 12, size_field);
    set_tar_checksum(bad.data() + header);
    write_bytes(shard, bad);
    REQUIRE_THROWS_WITH(index_tar_shards({shard}), Contains(shard) && Contains("byte 512") && Contains("too large"));
  }
  SECTION("not a tar file at all") {
    write_bytes(shard, std::string(4096, 'x'));
    REQUIRE_THROWS_WITH(index_tar_shards({shard}), Contains(shard) && Contains("not a tar archive"));
  }
  SECTION("missing") {
    REQUIRE_THROWS_WITH(index_tar_shards({dir.file("nope.tar")}), Contains("nope.tar"));
  }
}
