#pragma once
// WebDataset-style tar shards, indexed for random access: each shard's
// headers are read once (the data is skipped, not read), and every sample,
// the consecutive members sharing a key (`dir/n01440764_10026.jpg` and
// `dir/n01440764_10026.cls` are one sample, key `dir/n01440764_10026`), is
// recorded as where its members' bytes lie. A batch then reads just its
// samples' bytes with pread, in any order, so the DistributedSampler and the
// seeded crops work on shards exactly as on an image folder.
//
// A plain reader, not libarchive: shards are uncompressed POSIX (ustar) or GNU
// tar written by Python's tarfile or GNU tar, so the format needed is the
// 512-byte header (with pax and GNU long names), and one dependency less.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mix::data {

/// Where one member's bytes are in its shard.
struct TarMemberSpan {
  uint64_t offset = 0;
  uint64_t size = 0;
};

/// One sample: its key and its members by extension ("jpg", "cls", "png", ...).
struct TarSample {
  int32_t shard = 0;  // index into TarIndex::shards
  std::string key;
  std::map<std::string, TarMemberSpan> members;
};

struct TarIndex {
  std::vector<std::string> shards;
  std::vector<TarSample> samples;  // shard order, then order within the shard
};

/// Indexes `shards` in order. A file that is not a tar archive, a header
/// whose checksum fails, a member that runs past the end of the file or a
/// missing end: mix::Error naming the shard and the byte offset.
TarIndex index_tar_shards(const std::vector<std::string>& shards);

/// Reads one member's bytes (pread: safe from several threads at once).
std::vector<uint8_t> read_tar_member(const std::string& shard, const TarMemberSpan& span);

}  // namespace mix::data
