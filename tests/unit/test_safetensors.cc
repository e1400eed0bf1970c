// safetensors reader and writer: round trips, every corrupt-file error, atomic
// writes, and interchange with files written and read by Python.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/core/check.h"
#include "runtime/io/safetensors.h"
#include "tests/unit/temp_files.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using mix::DType;
using namespace mix::test;
using mix::Tensor;

namespace {

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A hand-made safetensors file: length, header text, data.
void write_raw(const std::string& p, const std::string& header, const std::string& data) {
  write_bytes(p, le64(header.size()) + header + data);
}

Tensor filled(const mix::Shape& shape, DType dt, uint8_t salt) {
  Tensor t = Tensor::empty(shape, dt);
  auto* b = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.bytes(); ++i) b[i] = static_cast<uint8_t>(i * 31 + salt);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.bytes() == b.bytes() &&
         (a.bytes() == 0 || std::memcmp(a.raw(), b.raw(), a.bytes()) == 0);
}

fs::path source_dir() {
  if (const char* s = std::getenv("MIX_SOURCE_DIR")) return s;
  return fs::absolute(fs::path(__FILE__)).parent_path().parent_path().parent_path();
}

}  // namespace

TEST_CASE("safetensors round-trips every dtype, empty tensors and metadata", "[safetensors]") {
  TempDir dir;
  const std::string p = dir.file("all.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"z.f32", filled({3, 5}, DType::f32, 1)},   {"a.f16", filled({7}, DType::f16, 2)},
      {"m.bf16", filled({2, 3, 4}, DType::bf16, 3)}, {"i32", filled({4, 1}, DType::i32, 4)},
      {"i64", filled({5}, DType::i64, 5)},         {"empty", filled({0}, DType::f32, 6)},
      {"empty2d", filled({3, 0}, DType::f16, 7)},  {"scalar", filled({}, DType::f32, 8)},
  };
  const std::map<std::string, std::string> meta = {{"step", "42"}, {"loss_scale", "32768"}, {"note", "a \"quoted\" é"}};
  mix::io::write_safetensors(p, ts, meta);
  REQUIRE_FALSE(fs::exists(p + ".tmp"));

  const auto f = mix::io::read_safetensors(p);
  // Written contiguously in the given order, so the file order is the given order.
  REQUIRE(f.tensors.size() == ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    INFO(ts[i].first);
    CHECK(f.tensors[i].first == ts[i].first);
    CHECK(same_bytes(f.tensors[i].second, ts[i].second));
  }
  CHECK(f.metadata == meta);
  REQUIRE(f.find("i64") != nullptr);
  CHECK(f.find("i64")->dtype() == DType::i64);
  CHECK(f.find("nope") == nullptr);

  // Header padded with spaces to a multiple of 8, so the data is 8-byte aligned.
  const std::string raw = read_bytes(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[i]);
  CHECK(n % 8 == 0);
  const std::string header = raw.substr(8, n);
  CHECK(header.front() == '{');
  CHECK(header.find_last_not_of(' ') == header.rfind('}'));
  CHECK(header.find("\"z.f32\"") < header.find("\"a.f16\""));  // given order, not sorted
  size_t data = 0;
  for (const auto& [name, t] : ts) data += t.bytes();
  CHECK(raw.size() == 8 + n + data);
}

TEST_CASE("safetensors writes a file with no tensors and reads it back", "[safetensors]") {
  TempDir dir;
  const std::string p = dir.file("none.safetensors");
  mix::io::write_safetensors(p, {});
  const auto f = mix::io::read_safetensors(p);
  CHECK(f.tensors.empty());
  CHECK(f.metadata.empty());
}

TEST_CASE("safetensors reader accepts headers padded with spaces and any key order", "[safetensors]") {
  TempDir dir;
  const std::string p = dir.file("padded.safetensors");
  std::string data(12, '\0');
  const float a[2] = {1.5f, -2.0f};
  const int32_t b = 7;
  std::memcpy(data.data() + 4, a, 8);  // "a" after "b" in the data
  std::memcpy(data.data(), &b, 4);
  write_raw(p,
            R"({"a":{"shape":[2],"data_offsets":[4,12],"dtype":"F32"},"b":{"dtype":"I32","shape":[],)"
            R"("data_offsets":[0,4]},"__metadata__":{"format":"pt"}}        )",
            data);
  const auto f = mix::io::read_safetensors(p);
  REQUIRE(f.tensors.size() == 2);
  CHECK(f.tensors[0].first == "b");  // order of data offsets
  CHECK(f.tensors[0].second.data<int32_t>()[0] == 7);
  CHECK(f.tensors[1].second.to_floats() == std::vector<float>{1.5f, -2.0f});
  CHECK(f.metadata.at("format") == "pt");
}

TEST_CASE("safetensors reader names the file and the problem for every corrupt file", "[safetensors]") {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  using mix::io::read_safetensors;
  // Catch2 matcher combinations hold references to their parts, so they must be
  // built inside the assertion: a macro, not a function.
#define fails_with(what) Contains(p) && Contains(what)

  SECTION("missing file") {
    REQUIRE_THROWS_AS(read_safetensors(p), mix::Error);
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("cannot open") && Contains("No such file"));
  }
  SECTION("a directory") {
    fs::create_directory(p);
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("directory"));
  }
  SECTION("empty and shorter than the length field") {
    write_bytes(p, "");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("8-byte"));
    write_bytes(p, "abcde");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("8-byte"));
  }
  SECTION("header length beyond the file") {
    write_bytes(p, le64(100) + "{}");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("header length 100"));
    write_bytes(p, le64(~uint64_t{0}) + "{}");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("header length"));
  }
  SECTION("a header past the size limit, in a file that holds it") {
    // A sparse file of 200 MiB whose length field claims its whole body: refused
    // before the reader allocates and reads a 200 MiB header.
    const uint64_t huge = 200ull << 20;
    write_bytes(p, le64(huge));
    fs::resize_file(p, 8 + huge);
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("header of 209715200 bytes exceeds"));
  }
  SECTION("bad JSON") {
    write_raw(p, R"({"a": {"dtype": "F32", )", "");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("not valid JSON"));
    write_raw(p, "[1, 2]", "");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("not a JSON object"));
    write_raw(p, R"({"a": 3})", "");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'a'"));
  }
  SECTION("entry missing a field") {
    write_raw(p, R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("dtype"));
    write_raw(p, R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("shape"));
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [1]}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("data_offsets"));
  }
  SECTION("malformed fields") {
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("shape"));
    write_raw(p, R"({"w": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("shape"));
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("data_offsets"));
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p),
                        fails_with("'w'") && Contains("data_offsets") && Contains("end before they begin"));
    write_raw(p, R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("dtype"));
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 4]}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("too large"));
    write_raw(p, R"({"__metadata__": {"step": 3}})", "");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("metadata") && Contains("step"));
  }
  SECTION("unknown dtype") {
    write_raw(p, R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", "abcdefgh");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("F64") && Contains("F32"));
    // Only the safetensors spellings are dtypes in a header.
    write_raw(p, R"({"w": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("f32"));
  }
  SECTION("offsets that do not match the shape") {
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", std::string(24, 'x'));
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("needs 24"));
    write_raw(p, R"({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 8]}})", std::string(8, 'x'));
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("'w'") && Contains("needs 4"));
  }
  SECTION("offsets beyond the data (truncated file)") {
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", std::string(12, 'x'));
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("truncated") && Contains("'w'"));
    // A correct file cut short.
    const std::string good = dir.file("good.safetensors");
    mix::io::write_safetensors(good, {{"w", filled({64}, DType::f32, 0)}});
    const std::string all = read_bytes(good);
    write_bytes(p, all.substr(0, all.size() - 1));
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("truncated"));
  }
  SECTION("bytes after the last tensor") {
    // A correct file with bytes appended: the header no longer describes the data.
    const std::string good = dir.file("good.safetensors");
    mix::io::write_safetensors(good, {{"w", filled({4}, DType::f32, 0)}});
    write_bytes(p, read_bytes(good) + "junk");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("4 bytes after the last tensor") && Contains("[16, 20)"));
    // A file of no tensors holds no data.
    write_raw(p, "{}      ", "x");
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("1 bytes after the last tensor"));
  }
  SECTION("a hole between tensors, or before the first") {
    write_raw(p,
              R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
              R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
              std::string(12, 'x'));
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("[4, 8) belong to no tensor") && Contains("'a' and 'b'"));
    write_raw(p, R"({"b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", std::string(8, 'x'));
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("[0, 4) belong to no tensor") && Contains("before tensor 'b'"));
  }
  SECTION("overlapping tensors") {
    write_raw(p,
              R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
              R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
              std::string(8, 'x'));
    REQUIRE_THROWS_WITH(read_safetensors(p), fails_with("overlap") && Contains("'a'") && Contains("'b'"));
  }
  SECTION("a field a tensor entry does not have") {
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "byteorder": "big"}})", "abcd");
    REQUIRE_THROWS_WITH(read_safetensors(p),
                        fails_with("'w'") && Contains("\"byteorder\"") && Contains("__metadata__"));
  }
#undef fails_with
}

TEST_CASE("safetensors reader accepts empty tensors at any point of the data", "[safetensors]") {
  // An empty tensor owns no bytes; it is written at the offset reached, which
  // may be the start of the next tensor's data or the end of all data.
  TempDir dir;
  const std::string p = dir.file("empty.safetensors");
  write_raw(p,
            R"({"z": {"dtype": "F32", "shape": [4], "data_offsets": [4, 20]},)"
            R"( "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},)"
            R"( "a": {"dtype": "I32", "shape": [], "data_offsets": [0, 4]},)"
            R"( "end": {"dtype": "F16", "shape": [0, 3], "data_offsets": [20, 20]}})",
            std::string(20, 'x'));
  const auto f = mix::io::read_safetensors(p);
  REQUIRE(f.tensors.size() == 4);
  CHECK(f.tensors[0].first == "a");
  CHECK(f.tensors[1].first == "e");
  CHECK(f.tensors[2].first == "z");
  CHECK(f.tensors[3].first == "end");
}

TEST_CASE("a failed safetensors write names the path and leaves the old file intact", "[safetensors]") {
  TempDir dir;
  const std::string p = dir.file("ckpt.safetensors");
  const std::vector<std::pair<std::string, Tensor>> old_ts = {{"w", filled({8}, DType::f32, 1)}};
  mix::io::write_safetensors(p, old_ts, {{"step", "1"}});
  const std::string before = read_bytes(p);
  const std::vector<std::pair<std::string, Tensor>> new_ts = {{"w", filled({16}, DType::f32, 2)}};
  using mix::io::write_safetensors;

  SECTION("the temporary file cannot be created") {
    fs::create_directory(p + ".tmp");  // open(path.tmp) fails: it is a directory
    REQUIRE_THROWS_WITH(write_safetensors(p, new_ts), Contains(p) && Contains("cannot write"));
    CHECK(read_bytes(p) == before);
    CHECK(fs::is_directory(p + ".tmp"));  // not ours: left alone
  }
  SECTION("the directory does not exist") {
    const std::string q = dir.file("no/such/dir/ckpt.safetensors");
    REQUIRE_THROWS_WITH(write_safetensors(q, new_ts), Contains(q) && Contains("No such file"));
    CHECK_FALSE(fs::exists(dir.file("no")));
  }
  SECTION("the rename fails") {
    const std::string d = dir.file("a_directory");
    fs::create_directories(d + "/inside");
    REQUIRE_THROWS_WITH(write_safetensors(d, new_ts), Contains(d) && Contains("renaming"));
    CHECK(fs::is_directory(d + "/inside"));
    CHECK_FALSE(fs::exists(d + ".tmp"));  // the temporary file is removed
  }
  SECTION("invalid tensors are refused before any file is touched") {
    REQUIRE_THROWS_WITH(write_safetensors(p, {{"w", new_ts[0].second}, {"w", new_ts[0].second}}),
                        Contains(p) && Contains("twice"));
    REQUIRE_THROWS_WITH(write_safetensors(p, {{"__metadata__", new_ts[0].second}}), Contains(p));
    REQUIRE_THROWS_WITH(write_safetensors(p, {{"", new_ts[0].second}}), Contains(p));
    REQUIRE_THROWS_WITH(write_safetensors(p, {{"u", Tensor()}}), Contains(p) && Contains("undefined"));
    CHECK(read_bytes(p) == before);
    CHECK_FALSE(fs::exists(p + ".tmp"));
  }
  SECTION("a successful write replaces the file") {
    write_safetensors(p, new_ts);
    const auto f = mix::io::read_safetensors(p);
    REQUIRE(f.tensors.size() == 1);
    CHECK(same_bytes(f.tensors[0].second, new_ts[0].second));
    CHECK(f.metadata.empty());
    CHECK_FALSE(fs::exists(p + ".tmp"));
  }
}

// Python writes the file by building the header by hand (the format is simple
// enough that this is what the `safetensors` package itself does).
static const char* const kPyWriter = R"PY(
import json, struct, sys
import numpy as np
path = sys.argv[1]
arrays = {
    "fc.weight": np.arange(12, dtype=np.float32).reshape(3, 4) / 8 - 0.5,
    "fc.bias": np.array([1e-3, -2.5, 65504.0], dtype=np.float16),
    "step": np.array(123456789012, dtype=np.int64),
    "ids": np.array([[-1, 2], [3, -4]], dtype=np.int32),
    "empty": np.zeros((0, 3), dtype=np.float32),
}
# bfloat16: the top 16 bits of float32 (these values are exact in bf16).
bf = (np.array([1.0, -0.15625, 2.0**100], dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
names = {np.float32: "F32", np.float16: "F16", np.int64: "I64", np.int32: "I32"}
header, blobs, off = {"__metadata__": {"framework": "numpy", "epoch": "3"}}, [], 0
for name, a in list(arrays.items()) + [("bf", bf)]:
    dt = "BF16" if name == "bf" else names[a.dtype.type]
    b = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
    header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
)PY";

// Python parses what we wrote, with nothing but json, struct and numpy.
static const char* const kPyReader = R"PY(
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
assert n % 8 == 0, n
h = json.loads(raw[8:8 + n])
data = raw[8 + n:]
assert h["__metadata__"] == {"who": "mixtrain", "step": "7"}, h["__metadata__"]
kinds = {"F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4"}
def get(name):
    e = h[name]
    b, end = e["data_offsets"]
    return np.frombuffer(data[b:end], dtype=kinds[e["dtype"]]).reshape(e["shape"])
assert np.array_equal(get("w"), np.array([[0.25, -1.0, 3.5], [1e-8, 0.0, -0.0]], dtype=np.float32)), get("w")
assert np.array_equal(get("h"), np.array([0.5, -65504.0], dtype=np.float16))
assert get("n").tolist() == [1, -2, 1 << 40]
assert get("e").shape == (2, 0)
assert list(h.keys()) == ["__metadata__", "w", "h", "n", "e"], list(h.keys())
assert len(data) == h["e"]["data_offsets"][1]
)PY";

TEST_CASE("safetensors files interchange with Python", "[safetensors][python]") {
  if (!fs::exists(kPython)) {
    WARN("no " << kPython << ": Python interchange not tested");
    return;
  }
  TempDir dir;
  SECTION("reading a file Python wrote") {
    const std::string p = dir.file("from_python.safetensors");
    REQUIRE(run_python(dir, kPyWriter, p) == 0);
    const auto f = mix::io::read_safetensors(p);
    CHECK(f.metadata == std::map<std::string, std::string>{{"framework", "numpy"}, {"epoch", "3"}});
    REQUIRE(f.tensors.size() == 6);
    const Tensor* w = f.find("fc.weight");
    REQUIRE(w);
    CHECK(w->dtype() == DType::f32);
    CHECK(w->shape() == mix::Shape{3, 4});
    for (int i = 0; i < 12; ++i) CHECK(w->data<float>()[i] == static_cast<float>(i) / 8 - 0.5f);
    const Tensor* b = f.find("fc.bias");
    REQUIRE(b);
    CHECK(b->dtype() == DType::f16);
    CHECK(b->to_floats() == std::vector<float>{mix::round_to_half(1e-3f), -2.5f, 65504.0f});
    const Tensor* s = f.find("step");
    REQUIRE(s);
    CHECK(s->shape().empty());
    CHECK(s->data<int64_t>()[0] == 123456789012LL);
    const Tensor* ids = f.find("ids");
    REQUIRE(ids);
    CHECK(ids->dtype() == DType::i32);
    CHECK(std::vector<int32_t>(ids->data<int32_t>(), ids->data<int32_t>() + 4) == std::vector<int32_t>{-1, 2, 3, -4});
    const Tensor* e = f.find("empty");
    REQUIRE(e);
    CHECK(e->shape() == mix::Shape{0, 3});
    const Tensor* bf = f.find("bf");
    REQUIRE(bf);
    CHECK(bf->dtype() == DType::bf16);
    CHECK(bf->to_floats() == std::vector<float>{1.0f, -0.15625f, std::ldexp(1.0f, 100)});
  }
  SECTION("Python reading a file we wrote") {
    const std::string p = dir.file("to_python.safetensors");
    Tensor h = Tensor::empty({2}, DType::f16);
    h.data<uint16_t>()[0] = mix::float_to_half_bits(0.5f);
    h.data<uint16_t>()[1] = mix::float_to_half_bits(-65504.0f);
    Tensor n = Tensor::empty({3}, DType::i64);
    n.data<int64_t>()[0] = 1;
    n.data<int64_t>()[1] = -2;
    n.data<int64_t>()[2] = int64_t{1} << 40;
    mix::io::write_safetensors(p,
                               {{"w", Tensor::from_floats({2, 3}, {0.25f, -1.0f, 3.5f, 1e-8f, 0.0f, -0.0f})},
                                {"h", h},
                                {"n", n},
                                {"e", Tensor::empty({2, 0}, DType::f32)}},
                               {{"who", "mixtrain"}, {"step", "7"}});
    CHECK(run_python(dir, kPyReader, p) == 0);
  }
  SECTION("the project's Python helper, when present") {
    const fs::path helper = source_dir() / "tests" / "python" / "safetensors_io.py";
    if (!fs::exists(helper)) {
      WARN(helper.string() << " not present yet: only the inline Python writer was tested");
      return;
    }
    const std::string p = dir.file("helper.safetensors");
    const std::string script = "import sys\nsys.path.insert(0, " + std::string("'") + helper.parent_path().string() +
                               "')\nimport numpy as np\nimport safetensors_io\n"
                               "safetensors_io.save(sys.argv[1], {'a': np.arange(6, dtype=np.float32).reshape(2, 3),"
                               " 'b': np.array([5, -6], dtype=np.int64)}, {'k': 'v'})\n";
    REQUIRE(run_python(dir, script, p) == 0);
    const auto f = mix::io::read_safetensors(p);
    REQUIRE(f.find("a"));
    CHECK(f.find("a")->shape() == mix::Shape{2, 3});
    CHECK(f.find("a")->to_floats() == std::vector<float>{0, 1, 2, 3, 4, 5});
    REQUIRE(f.find("b"));
    CHECK(f.find("b")->data<int64_t>()[1] == -6);
    CHECK(f.metadata.at("k") == "v");

    // And the helper's strict reader (it insists that tensors tile the data) reads ours.
    const std::string q = dir.file("for_helper.safetensors");
    Tensor bf = Tensor::empty({2}, DType::bf16);
    bf.data<uint16_t>()[0] = mix::float_to_bf16_bits(1.0f);
    bf.data<uint16_t>()[1] = mix::float_to_bf16_bits(-0.5f);
    mix::io::write_safetensors(q,
                               {{"w", Tensor::from_floats({2, 2}, {1, 2, 3, 4})},
                                {"bf", bf},
                                {"none", Tensor::empty({0, 5}, DType::i64)},
                                {"i", Tensor::zeros({3}, DType::i32)}},
                               {{"step", "9"}});
    const std::string check = "import sys\nsys.path.insert(0, '" + helper.parent_path().string() +
                              "')\nimport numpy as np\nimport safetensors_io as st\n"
                              "t, d, m = st.load_with_dtypes(sys.argv[1])\n"
                              "assert m == {'step': '9'}, m\n"
                              "assert d == {'w': 'F32', 'bf': 'BF16', 'none': 'I64', 'i': 'I32'}, d\n"
                              "assert t['w'].tolist() == [[1, 2], [3, 4]]\n"
                              "assert st.bf16_to_f32(t['bf']).tolist() == [1.0, -0.5]\n"
                              "assert t['none'].shape == (0, 5) and t['i'].tolist() == [0, 0, 0]\n";
    CHECK(run_python(dir, check, q) == 0);
  }
}
