// Fashion-MNIST from IDX files (http://yann.lecun.com/exdb/mnist/ describes the
// format): a big-endian magic 0x000008NN (0x08 = unsigned bytes, NN = number of
// dimensions), NN big-endian u32 dimensions, then the bytes.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runtime/core/check.h"
#include "runtime/data/dataset.h"

namespace mix::data {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr int64_t kRows = 28, kCols = 28;
constexpr int64_t kClasses = 10;
// The training set's pixel statistics after scaling to [0, 1] (the values
// torchvision examples normalise Fashion-MNIST with).
constexpr float kMean = 0.2860f, kStd = 0.3530f;

// Where the Debian package dataset-fashion-mnist puts the files.
const char* const kPackageDir = "/usr/share/datasets/fashion-mnist";
// For a directory or file that is not there.
const char* const kHint = "install the Debian package dataset-fashion-mnist (scripts/setup.sh does) or pass --data-dir";

// For a file that is there but damaged: the package can be reinstalled, but a
// file under the user's own --data-dir is theirs to replace (pointing them at
// the package would suggest the package was missing).
std::string damaged_hint(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::equivalent(dir, kPackageDir, ec))
    return "reinstall the package (apt-get install --reinstall dataset-fashion-mnist)";
  return "replace the file with an intact copy (gzip -t FILE checks a .gz file)";
}

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};

struct GzCloser {
  gzFile f;
  ~GzCloser() {
    if (f) gzclose(f);
  }
};

std::string gz_error_text(gzFile f, const std::string& path) {
  int code = 0;
  const char* msg = gzerror(f, &code);
  if (code == Z_ERRNO) return std::strerror(errno);
  std::string m = msg && *msg ? msg : "unknown zlib error";
  // zlib prefixes the message with the path, which our messages already give.
  if (m.rfind(path + ": ", 0) == 0) m.erase(0, path.size() + 2);
  return m;
}

// Reads exactly n bytes or throws naming the file and what was being read.
void read_exact(gzFile f, const std::string& path, void* dst, size_t n, const char* what, const std::string& hint) {
  auto* out = static_cast<unsigned char*>(dst);
  size_t got = 0;
  while (got < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, size_t{1} << 30));
    const int r = gzread(f, out + got, chunk);
    if (r < 0)
      MIX_FAIL(path << " is corrupt (" << gz_error_text(f, path) << ") while reading " << what << ": " << hint);
    if (r == 0) {
      // gzread reports a truncated stream either as an error or as end of file.
      int code = 0;
      gzerror(f, &code);
      MIX_FAIL(path << " is truncated: it ends after " << got << " of the " << n << " bytes of " << what
                    << (code != Z_OK ? " (" + gz_error_text(f, path) + ")" : std::string()) << ": " << hint);
    }
    got += static_cast<size_t>(r);
  }
}

// The path to read: `path` if it exists, else the same name without ".gz".
std::string resolve(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(path, ec)) return path;
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    const std::string plain = path.substr(0, path.size() - 3);
    if (fs::exists(plain, ec)) return plain;
    MIX_FAIL("Fashion-MNIST file " << path << " not found (nor " << plain << "): " << kHint);
  }
  MIX_FAIL("Fashion-MNIST file " << path << " not found: " << kHint);
}

IdxArray read_idx(const std::string& path, uint32_t expected_magic, const char* kind, const std::string& hint) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");  // also reads files that are not gzip-compressed
  if (!f)
    MIX_FAIL("cannot open " << path << ": " << (errno ? std::strerror(errno) : "out of memory") << ": " << hint);
  GzCloser closer{f};
  gzbuffer(f, 1 << 18);  // fewer, larger reads than the 8 KiB default
  if (std::filesystem::is_directory(path)) MIX_FAIL("cannot read " << path << ": it is a directory: " << hint);

  std::array<unsigned char, 4> m{};
  read_exact(f, path, m.data(), 4, "the magic number", hint);
  const uint32_t magic = (uint32_t{m[0]} << 24) | (uint32_t{m[1]} << 16) | (uint32_t{m[2]} << 8) | m[3];
  if (magic != expected_magic) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", magic);
    char want[16];
    std::snprintf(want, sizeof want, "0x%08x", expected_magic);
    MIX_FAIL(path << " is not an IDX " << kind << " file: magic number " << buf << ", expected " << want << ": "
                  << hint);
  }
  IdxArray a;
  const int ndim = static_cast<int>(magic & 0xff);
  size_t total = 1;
  for (int i = 0; i < ndim; ++i) {
    std::array<unsigned char, 4> d{};
    read_exact(f, path, d.data(), 4, "the dimensions", hint);
    const uint32_t v = (uint32_t{d[0]} << 24) | (uint32_t{d[1]} << 16) | (uint32_t{d[2]} << 8) | d[3];
    a.dims.push_back(v);
    // Fashion-MNIST is 47 MB; anything past 4 GiB is a corrupt header, not data.
    if (v != 0 && total > (size_t{1} << 32) / v)
      MIX_FAIL(path << ": implausible IDX dimensions (corrupt header): " << hint);
    total *= v;
  }
  a.bytes.resize(total);
  read_exact(f, path, a.bytes.data(), total, (std::string("the ") + kind).c_str(), hint);
  // Reading past the end makes zlib verify the gzip trailer (CRC-32 and
  // length), so corruption inside the data is caught too. A file cut short in
  // its trailer has already given all its data: gzread then reports end of
  // file (0) and keeps "unexpected end of file" (Z_BUF_ERROR) as a soft
  // error, with the CRC never checked, so that error must be looked at too.
  unsigned char extra;
  const int r = gzread(f, &extra, 1);
  if (r < 0) MIX_FAIL(path << " is corrupt (" << gz_error_text(f, path) << "): " << hint);
  if (r > 0) MIX_FAIL(path << " has more data than its IDX header describes (corrupt file): " << hint);
  int code = Z_OK;
  gzerror(f, &code);
  if (code == Z_BUF_ERROR)
    MIX_FAIL(path << " is truncated: it ends before its gzip stream does (the CRC-32 and length that close it are "
                  << "cut off), so its data cannot be checked: " << hint);
  if (code != Z_OK) MIX_FAIL(path << " is corrupt (" << gz_error_text(f, path) << "): " << hint);
  return a;
}

Dataset load_split(const std::string& dir, const std::string& prefix) {
  const std::string hint = damaged_hint(dir);
  const std::string img_path = resolve(dir + "/" + prefix + "-images-idx3-ubyte.gz");
  const std::string lbl_path = resolve(dir + "/" + prefix + "-labels-idx1-ubyte.gz");
  IdxArray img = read_idx(img_path, kImagesMagic, "images", hint);
  IdxArray lbl = read_idx(lbl_path, kLabelsMagic, "labels", hint);
  if (img.dims[1] != kRows || img.dims[2] != kCols)
    MIX_FAIL(img_path << " holds " << img.dims[1] << "x" << img.dims[2] << " images, expected 28x28: " << hint);
  const int64_t n = img.dims[0];
  if (lbl.dims[0] != n)
    MIX_FAIL(img_path << " holds " << n << " images but " << lbl_path << " holds " << lbl.dims[0]
                      << " labels: " << hint);

  Dataset ds;
  ds.name = "fashion-mnist";
  ds.num_classes = kClasses;
  ds.labels = Tensor::empty({n}, DType::i64);
  auto* labels = ds.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t v = lbl.bytes[static_cast<size_t>(i)];
    if (v >= kClasses) MIX_FAIL(lbl_path << ": label " << int{v} << " at index " << i << " is not in 0..9: " << hint);
    labels[i] = v;
  }

  // Same float arithmetic as torchvision's ToTensor (x / 255) then Normalize
  // ((x - mean) / std), so inputs match PyTorch's bit for bit.
  std::array<float, 256> lut{};
  for (int p = 0; p < 256; ++p) {
    const float x = static_cast<float>(p) / 255.0f;
    lut[static_cast<size_t>(p)] = (x - kMean) / kStd;
  }
  const int64_t features = kRows * kCols;
  ds.inputs = Tensor::empty({n, features}, DType::f32);
  float* out = ds.inputs.data<float>();
  const size_t count = static_cast<size_t>(n * features);
  for (size_t i = 0; i < count; ++i) out[i] = lut[img.bytes[i]];
  return ds;
}

}  // namespace

TrainTest load_fashion_mnist(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    MIX_FAIL("Fashion-MNIST directory " << dir << " does not exist: " << kHint);
  TrainTest tt;
  tt.train = load_split(dir, "train");
  tt.test = load_split(dir, "t10k");
  return tt;
}

}  // namespace mix::data
