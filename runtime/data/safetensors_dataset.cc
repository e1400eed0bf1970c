// A user's own data set from a safetensors file (--data-file).
#include <algorithm>

#include "runtime/core/check.h"
#include "runtime/data/dataset.h"
#include "runtime/io/safetensors.h"

namespace mix::data {

namespace {

const char* const kLayout =
    "a --data-file holds 'inputs' float32 [N, ...] and 'labels' int64 [N], optionally 'test_inputs' and "
    "'test_labels'";

// The output layer has a row for every class from 0 to the largest label, and
// each step's logits are [batch, classes] in FP32: at 2^24 classes that is
// already 4 GiB of logits for a batch of 64, and 64 MiB of weights per input
// feature, far past any classifier (the largest label sets in use are in the
// tens of thousands). It is --vocab's limit too. A larger label is a corrupt
// or unconverted file, and would otherwise overflow the class count
// (INT64_MAX + 1) or fail in the allocator with a message naming neither.
constexpr int64_t kMaxClasses = int64_t{1} << 24;

std::string names_in(const io::SafetensorsFile& f) {
  std::string s;
  for (const auto& [n, t] : f.tensors) {
    if (!s.empty()) s += ", ";
    s += n + " (" + std::string(dtype_safetensors_name(t.dtype())) + " " + shape_str(t.shape()) + ")";
  }
  return s.empty() ? "no tensors" : s;
}

Tensor get_inputs(const std::string& path, const io::SafetensorsFile& f, const std::string& name) {
  const Tensor* t = f.find(name);
  if (!t) MIX_FAIL(path << ": no tensor '" << name << "' (" << kLayout << "; the file has " << names_in(f) << ")");
  if (t->dtype() != DType::f32)
    MIX_FAIL(path << ": tensor '" << name << "' is " << dtype_safetensors_name(t->dtype())
                  << ", expected F32 (float32); save it with .float() / .astype(np.float32)");
  if (t->ndim() == 0) MIX_FAIL(path << ": tensor '" << name << "' is a scalar, expected [N, ...] examples");
  // [N] is N examples of one feature.
  if (t->ndim() == 1) return t->reshaped({t->dim(0), 1});
  return *t;
}

Tensor get_labels(const std::string& path, const io::SafetensorsFile& f, const std::string& name, int64_t n) {
  const Tensor* t = f.find(name);
  if (!t) MIX_FAIL(path << ": no tensor '" << name << "' (" << kLayout << "; the file has " << names_in(f) << ")");
  if (t->dtype() != DType::i64)
    MIX_FAIL(path << ": tensor '" << name << "' is " << dtype_safetensors_name(t->dtype())
                  << ", expected I64 (int64) class indices; save it with .long() / .astype(np.int64)");
  if (t->ndim() != 1)
    MIX_FAIL(path << ": tensor '" << name << "' has shape " << shape_str(t->shape()) << ", expected [N] class indices");
  if (t->dim(0) != n)
    MIX_FAIL(path << ": tensor '" << name << "' holds " << t->dim(0) << " labels but its inputs hold " << n
                  << " examples");
  const int64_t* v = t->data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (v[i] < 0)
      MIX_FAIL(path << ": tensor '" << name << "' has a negative label " << v[i] << " at example " << i
                    << "; labels are class indices 0..K-1");
    if (v[i] >= kMaxClasses)
      MIX_FAIL(path << ": tensor '" << name << "' has label " << v[i] << " at example " << i
                    << ", which cannot be a class index: the output layer has a row per class up to the largest "
                       "label, and mixtrain takes at most "
                    << kMaxClasses << " classes; renumber the labels as 0..K-1");
  }
  return *t;
}

int64_t max_label(const Tensor& labels) {
  const int64_t* v = labels.data<int64_t>();
  int64_t m = -1;
  for (int64_t i = 0; i < labels.numel(); ++i) m = std::max(m, v[i]);
  return m;
}

}  // namespace

TrainTest load_safetensors_dataset(const std::string& path) {
  const io::SafetensorsFile f = io::read_safetensors(path);
  TrainTest tt;
  tt.train.name = path;
  tt.test.name = path;

  tt.train.inputs = get_inputs(path, f, "inputs");
  const int64_t n = tt.train.inputs.dim(0);
  if (n == 0) MIX_FAIL(path << ": tensor 'inputs' holds no examples");
  tt.train.labels = get_labels(path, f, "labels", n);

  const bool has_ti = f.find("test_inputs") != nullptr;
  const bool has_tl = f.find("test_labels") != nullptr;
  if (has_ti != has_tl)
    MIX_FAIL(path << ": has '" << (has_ti ? "test_inputs" : "test_labels") << "' without '"
                  << (has_ti ? "test_labels" : "test_inputs") << "'; give both or neither");
  if (has_ti) {
    tt.test.inputs = get_inputs(path, f, "test_inputs");
    if (tt.test.example_shape() != tt.train.example_shape())
      MIX_FAIL(path << ": 'test_inputs' examples are " << shape_str(tt.test.example_shape()) << " but 'inputs' examples are "
                    << shape_str(tt.train.example_shape()));
    tt.test.labels = get_labels(path, f, "test_labels", tt.test.inputs.dim(0));
  } else {
    Shape s = tt.train.inputs.shape();
    s[0] = 0;
    tt.test.inputs = Tensor::empty(s, DType::f32);
    tt.test.labels = Tensor::empty({0}, DType::i64);
  }

  const int64_t classes = std::max(max_label(tt.train.labels), max_label(tt.test.labels)) + 1;
  tt.train.num_classes = classes;
  tt.test.num_classes = classes;
  return tt;
}

}  // namespace mix::data
