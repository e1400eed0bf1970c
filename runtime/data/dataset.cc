#include "runtime/data/dataset.h"

namespace mix::data {

Shape Dataset::example_shape() const {
  if (source) return source->example_shape();
  if (!inputs.defined() || inputs.ndim() == 0) return {};
  return Shape(inputs.shape().begin() + 1, inputs.shape().end());
}

}  // namespace mix::data
