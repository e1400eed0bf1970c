#include "collective/consistency.h"

#include <cstring>
#include <sstream>

namespace mix::collective {

namespace {
// Each field travels as a fixed-size record; longer values are cut and end in
// a hash of the whole, so two long values that differ still compare different.
constexpr size_t kValueBytes = 96;
constexpr size_t kNameBytes = 32;
constexpr size_t kRecord = kNameBytes + kValueBytes;

std::string fit(const std::string& s, size_t n) {
  if (s.size() < n) return s;
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  std::ostringstream o;
  o << s.substr(0, n - 20) << "..#" << std::hex << h;
  return o.str().substr(0, n - 1);
}
}  // namespace

void check_same_on_all_ranks(Communicator& comm, const std::string& what, const Fields& fields) {
  const int world = comm.world_size();
  // The number of fields must agree before the records can be compared.
  std::vector<int64_t> counts(static_cast<size_t>(world));
  const int64_t mine = static_cast<int64_t>(fields.size());
  comm.all_gather(&mine, counts.data(), sizeof(int64_t));
  for (int r = 1; r < world; ++r)
    if (counts[r] != counts[0])
      throw CollectiveError(what + ": rank " + std::to_string(r) + " sends " + std::to_string(counts[r]) +
                            " fields, rank 0 sends " + std::to_string(counts[0]) +
                            " (are all ranks running the same mixtrain build?)");

  std::vector<char> send(fields.size() * kRecord, 0);
  for (size_t i = 0; i < fields.size(); ++i) {
    const std::string n = fit(fields[i].first, kNameBytes), v = fit(fields[i].second, kValueBytes);
    std::memcpy(&send[i * kRecord], n.data(), n.size());
    std::memcpy(&send[i * kRecord + kNameBytes], v.data(), v.size());
  }
  std::vector<char> all(send.size() * static_cast<size_t>(world));
  comm.all_gather(send.data(), all.data(), send.size());

  auto field = [&](int rank, size_t i, size_t off, size_t len) {
    const char* p = &all[static_cast<size_t>(rank) * send.size() + i * kRecord + off];
    return std::string(p, strnlen(p, len));
  };
  std::ostringstream msg;
  bool differ = false;
  for (int r = 1; r < world; ++r) {
    for (size_t i = 0; i < fields.size(); ++i) {
      const std::string v0 = field(0, i, kNameBytes, kValueBytes), vr = field(r, i, kNameBytes, kValueBytes);
      if (v0 == vr && field(0, i, 0, kNameBytes) == field(r, i, 0, kNameBytes)) continue;
      msg << "\n  rank " << r << " differs from rank 0 in " << field(0, i, 0, kNameBytes) << ": rank 0 has '" << v0
          << "', rank " << r << " has '" << vr << "'";
      differ = true;
    }
  }
  if (differ)
    throw CollectiveError(what + " failed: the ranks do not agree" + msg.str() +
                          "\n  every rank must run the same model and training flags");
}

}  // namespace mix::collective
