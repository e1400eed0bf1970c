// A tar header's checksum set right after a test changed the header, so that
// the reader gets past the checksum to the field under test: the byte sum of
// the 512-byte header with its own 8-byte field counted as spaces, written
// as six octal digits, a NUL and a space.
#pragma once

#include <cstdio>
#include <cstring>

namespace mix::test {

inline void set_tar_checksum(char* header) {
  std::memset(header + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i) sum += static_cast<unsigned char>(header[i]);
  std::snprintf(header + 148, 8, "%06o", sum);  // the eighth byte stays a space
}

}  // namespace mix::test
