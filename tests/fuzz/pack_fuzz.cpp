// Fuzz entry: a .pack file (zip end records, zip64, central directory, local
// headers, alignment, manifest), opened from a scratch file because Pack
// maps a path. An accepted pack is then verified and every view touched.
#include <cstring>

#include "core/error.h"
#include "pack/pack.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_util.h"

namespace qtk::fuzz {

int pack_zip(const uint8_t* data, size_t size) {
  const std::string path = write_scratch_file("fuzz.pack", data, size);
  std::unique_ptr<Pack> pack;
  try {
    pack = Pack::open(path);
  } catch (const Error&) {
    return 0;
  }
  for (const PackTensorInfo& t : pack->tensors()) {
    fuzz_check(pack->find_tensor(t.name) == &t, "find_tensor() does not return the listed tensor");
    const int64_t nbytes = t.view.nbytes();
    fuzz_check(nbytes >= 0 && static_cast<uint64_t>(nbytes) <= size, "tensor larger than the file");
    if (nbytes > 0) {
      // A view outside the mapping faults here.
      char edge[2];
      std::memcpy(&edge[0], t.view.data, 1);
      std::memcpy(&edge[1], static_cast<const char*>(t.view.data) + nbytes - 1, 1);
      (void)edge;
    }
  }
  for (const char* name : {"tokenizer.json", "generation_config.json", "manifest.json"}) {
    if (auto e = pack->entry(name)) {
      fuzz_check(e->size() <= size, "entry larger than the file");
      if (!e->empty()) {
        volatile char first = e->front(), last = e->back();
        (void)first, (void)last;
      }
    }
  }
  try {
    (void)pack->verify();
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace qtk::fuzz
