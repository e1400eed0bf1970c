// Synthetic classification data: Gaussian inputs labelled by a fixed random
// linear teacher (argmax of W x), so a model can learn it to high accuracy.
#include "runtime/core/check.h"
#include "runtime/core/random.h"
#include "runtime/data/dataset.h"

namespace mix::data {

namespace {

// Streams of mix::Rng::for_stream(seed, ...): one per use, so that changing the
// train size does not change the test set or the teacher.
constexpr uint64_t kTeacherStream = 0x7eac4e7;
constexpr uint64_t kTrainStream = 1;
constexpr uint64_t kTestStream = 2;

Dataset make_split(const std::vector<double>& teacher, int64_t n, int64_t features, int64_t classes, Rng rng) {
  Dataset ds;
  ds.name = "synthetic";
  ds.num_classes = classes;
  ds.inputs = Tensor::empty({n, features}, DType::f32);
  ds.labels = Tensor::empty({n}, DType::i64);
  float* x = ds.inputs.data<float>();  // [n, features]
  int64_t* y = ds.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    float* row = x + i * features;
    for (int64_t k = 0; k < features; ++k) row[k] = static_cast<float>(rng.normal());
    int64_t best = 0;
    double best_score = 0;
    for (int64_t c = 0; c < classes; ++c) {
      const double* w = teacher.data() + c * features;  // teacher is [classes, features]
      double s = 0;
      for (int64_t k = 0; k < features; ++k) {
        const double p = w[k] * static_cast<double>(row[k]);
        s += p;
      }
      if (c == 0 || s > best_score) {
        best = c;
        best_score = s;
      }
    }
    y[i] = best;
  }
  return ds;
}

}  // namespace

TrainTest make_synthetic(int64_t train_size, int64_t test_size, int64_t features, int64_t classes, uint64_t seed) {
  if (train_size < 1) MIX_FAIL("synthetic data needs a train size >= 1, got " << train_size);
  if (test_size < 0) MIX_FAIL("synthetic data needs a test size >= 0, got " << test_size);
  if (features < 1) MIX_FAIL("synthetic data needs >= 1 feature, got " << features);
  if (classes < 2) MIX_FAIL("synthetic data needs >= 2 classes, got " << classes);
  Rng trng = Rng::for_stream(seed, kTeacherStream);
  std::vector<double> teacher(static_cast<size_t>(classes * features));
  for (double& w : teacher) w = trng.normal();
  TrainTest tt;
  tt.train = make_split(teacher, train_size, features, classes, Rng::for_stream(seed, kTrainStream));
  tt.test = make_split(teacher, test_size, features, classes, Rng::for_stream(seed, kTestStream));
  return tt;
}

namespace {

// Images of `classes` kinds: N(0, 1) noise plus 0.5 times a fixed +-1 pattern
// of the label's class. The patterns are hashed from (seed, class, pixel) on
// the fly, so no [classes, pixels] teacher is held (ImageNet-sized images with
// 1000 classes would need 600 MB for one).
Dataset make_image_split(int64_t n, int64_t channels, int64_t size, int64_t classes, uint64_t seed, Rng rng) {
  Dataset ds;
  ds.name = "synthetic-images";
  ds.num_classes = classes;
  const int64_t pixels = channels * size * size;
  ds.inputs = Tensor::empty({n, channels, size, size}, DType::f32);
  ds.labels = Tensor::empty({n}, DType::i64);
  float* x = ds.inputs.data<float>();
  int64_t* y = ds.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = static_cast<int64_t>(rng.below(static_cast<uint64_t>(classes)));
    y[i] = label;
    const uint64_t pattern = Rng::mix64(seed ^ Rng::mix64(static_cast<uint64_t>(label) + 0x9e3779b97f4a7c15ull));
    float* img = x + i * pixels;
    for (int64_t k = 0; k < pixels; ++k) {
      const float sign = (Rng::mix64(pattern + static_cast<uint64_t>(k)) & 1) ? 0.5f : -0.5f;
      img[k] = static_cast<float>(rng.normal()) + sign;
    }
  }
  return ds;
}

}  // namespace

TrainTest make_synthetic_images(int64_t train_size, int64_t test_size, int64_t channels, int64_t size, int64_t classes,
                                uint64_t seed) {
  if (train_size < 1) MIX_FAIL("synthetic data needs a train size >= 1, got " << train_size);
  if (channels < 1 || size < 1) MIX_FAIL("synthetic images need channels and a size >= 1");
  if (classes < 2) MIX_FAIL("synthetic data needs >= 2 classes, got " << classes);
  TrainTest tt;
  tt.train = make_image_split(train_size, channels, size, classes, seed, Rng::for_stream(seed, kTrainStream));
  tt.test = make_image_split(test_size, channels, size, classes, seed, Rng::for_stream(seed, kTestStream));
  return tt;
}

}  // namespace mix::data
