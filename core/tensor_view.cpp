#include "core/tensor_view.h"

namespace qtk {

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace qtk
