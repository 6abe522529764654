// NCCL loaded at run time, and the device collective on top of it (nccl.h).
#include "runtime/backend/cuda/nccl.h"

#include <cuda_bf16.h>
#include <dlfcn.h>
#include <glob.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rank_sum.h"

namespace qtk::cuda {
namespace {

// The few entries of NCCL's C ABI used here, declared from the documented
// signatures. ncclResult_t and ncclDataType_t are int-sized enums, passed and
// returned as int.
using NcclResult = int;
constexpr NcclResult kNcclSuccess = 0;
// note: the gather moves bytes (ncclInt8, = 0) whatever Act is: a gather
// does no arithmetic, so no other data type value is needed.
constexpr int kNcclInt8 = 0;

struct NcclApi {
  std::string path;
  NcclResult (*get_version)(int*) = nullptr;
  NcclResult (*comm_init_all)(ncclComm**, int, const int*) = nullptr;
  NcclResult (*all_gather)(const void*, void*, size_t, int, ncclComm*, cudaStream_t) = nullptr;
  NcclResult (*comm_destroy)(ncclComm*) = nullptr;
  const char* (*get_error_string)(NcclResult) = nullptr;
  const char* (*get_last_error)(ncclComm*) = nullptr;  // NCCL 2.13+; may be absent
};

// note: NCCL's NVLS algorithms (NVLink SHARP) create NVLink multicast objects.
// Multicast must stay off on the GPU machines this project runs on, and the
// all-gather here does not need it (NCCL then uses plain P2P over NVLink or
// PCIe). NCCL reads the variable when its first communicator is created, so
// it is set before NCCL is loaded. A value other than "0" that the user set
// is replaced too: multicast stays off whatever the environment says.
void disable_nvlink_multicast() {
  const char* v = std::getenv("NCCL_NVLS_ENABLE");
  if (v == nullptr || std::strcmp(v, "0") != 0) setenv("NCCL_NVLS_ENABLE", "0", 1);
}

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

// Where a Python environment's NVIDIA wheel (nvidia-nccl-cu*, a PyTorch
// dependency) puts the library; glob patterns, most specific first.
std::vector<std::string> wheel_patterns() {
  const std::string lib = "/nvidia/nccl/lib/libnccl.so.2";
  std::vector<std::string> p;
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv && *venv)
    p.push_back(std::string(venv) + "/lib/python3*/site-packages" + lib);
  if (const char* conda = std::getenv("CONDA_PREFIX"); conda && *conda)
    p.push_back(std::string(conda) + "/lib/python3*/site-packages" + lib);
  p.push_back("/opt/torch/.venv/lib/python3*/site-packages" + lib);
  if (const char* home = std::getenv("HOME"); home && *home)
    p.push_back(std::string(home) + "/.local/lib/python3*/site-packages" + lib);
  p.push_back("/usr/local/lib/python3*/dist-packages" + lib);
  p.push_back("/usr/local/lib/python3*/site-packages" + lib);
  p.push_back("/usr/lib/python3/dist-packages" + lib);
  p.push_back("/usr/lib/python3*/site-packages" + lib);
  p.push_back("/opt/conda/lib/python3*/site-packages" + lib);
  return p;
}

std::vector<std::string> glob_paths(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  return out;
}

template <class Fn>
void bind(void* handle, const std::string& path, const char* name, Fn& fn, bool required) {
  dlerror();
  void* sym = dlsym(handle, name);
  if (sym == nullptr && required)
    fail(
        "tensor parallel needs NCCL: {} has no symbol {} ({}); set QTK_NCCL_LIBRARY to a "
        "libnccl.so.2",
        path, name, dl_error());
  fn = reinterpret_cast<Fn>(sym);
}

std::unique_ptr<NcclApi> load_nccl() {
  disable_nvlink_multicast();
  // note: RTLD_LOCAL keeps NCCL's symbols out of the global namespace (a
  // second NCCL loaded by something else cannot bind to this one); a
  // usable library is never closed, since communicators may live until exit.
  constexpr int kFlags = RTLD_NOW | RTLD_LOCAL;
  void* handle = nullptr;
  std::string path;
  std::vector<std::string> tried;  // where it was looked for, for the message
  if (const char* env = std::getenv("QTK_NCCL_LIBRARY"); env && *env) {
    // The user named the file: no fallback that would hide a wrong path.
    handle = dlopen(env, kFlags);
    if (handle == nullptr)
      fail("tensor parallel needs NCCL (libnccl.so.2): QTK_NCCL_LIBRARY={} cannot be loaded: {}",
           env, dl_error());
    path = env;
  }
  if (handle == nullptr) {
    handle = dlopen("libnccl.so.2", kFlags);
    if (handle != nullptr) {
      path = "libnccl.so.2";  // replaced below by the file the loader chose
    } else {
      const std::string e = dl_error();
      tried.push_back(e.find("cannot open shared object file") != std::string::npos
                          ? "the library search path"
                          : "the library search path (" + e + ")");
    }
  }
  if (handle == nullptr) {
    for (const std::string& pattern : wheel_patterns()) {
      for (const std::string& file : glob_paths(pattern)) {
        handle = dlopen(file.c_str(), kFlags);
        if (handle != nullptr) {
          path = file;
          break;
        }
        tried.push_back(file + " (" + dl_error() + ")");
      }
      if (handle != nullptr) break;
      tried.push_back(pattern.substr(0, pattern.rfind('/')));
    }
  }
  if (handle == nullptr) {
    std::string where;
    for (const std::string& t : tried) where += (where.empty() ? "" : ", ") + t;
    fail(
        "tensor parallel needs NCCL (libnccl.so.2): not found in {}; set QTK_NCCL_LIBRARY to its "
        "path",
        where);
  }

  auto api = std::make_unique<NcclApi>();
  api->path = path;
  try {
    bind(handle, path, "ncclGetVersion", api->get_version, true);
    bind(handle, path, "ncclCommInitAll", api->comm_init_all, true);
    bind(handle, path, "ncclAllGather", api->all_gather, true);
    bind(handle, path, "ncclCommDestroy", api->comm_destroy, true);
    bind(handle, path, "ncclGetErrorString", api->get_error_string, true);
    bind(handle, path, "ncclGetLastError", api->get_last_error, false);
  } catch (...) {
    dlclose(handle);  // not an NCCL we can use
    throw;
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(api->get_version), &info) != 0 && info.dli_fname != nullptr &&
      *info.dli_fname)
    api->path = info.dli_fname;
  return api;
}

// Loaded once per process; a failed load throws and is tried again by the
// next call.
const NcclApi& nccl() {
  static const std::unique_ptr<NcclApi> api = load_nccl();
  return *api;
}

void check_nccl(NcclResult r, const char* call, ncclComm* comm) {
  if (r == kNcclSuccess) return;
  const NcclApi& api = nccl();
  const char* what = api.get_error_string ? api.get_error_string(r) : nullptr;
  const char* last = api.get_last_error ? api.get_last_error(comm) : nullptr;
  fail("{} failed: {} (NCCL error {}){}{}", call, what ? what : "unknown error", r,
       last && *last ? ": " : "", last && *last ? last : "");
}

// Makes `device` current for a scope and restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    QTK_CUDA_CHECK(cudaGetDevice(&saved_));
    if (saved_ != device) QTK_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(saved_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int saved_ = 0;
};

}  // namespace

const std::string& nccl_library_path() { return nccl().path; }

std::string nccl_version() {
  int code = 0;
  check_nccl(nccl().get_version(&code), "ncclGetVersion", nullptr);
  // note: NCCL 2.9 changed the encoding from X*1000 + Y*100 + Z to
  // X*10000 + Y*100 + Z.
  const bool wide = code >= 10000;
  const int major = wide ? code / 10000 : code / 1000;
  const int minor = wide ? code % 10000 / 100 : code % 1000 / 100;
  return fmt::format("{}.{}.{}", major, minor, code % 100);
}

// ---- DeviceCollective -------------------------------------------------------

DeviceCollective::~DeviceCollective() {
  // The workspace belongs to this rank's device, whichever thread destroys it.
  try {
    DeviceScope scope(device_);
    workspace_ = DeviceMemory();
  } catch (...) {
  }
}

void DeviceCollective::check_device(const char* what) const {
  int current = -1;
  QTK_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device_)
    fail(
        "{}: rank {} is on device {}, but device {} is current in this thread (call "
        "cudaSetDevice({}) in the rank's thread)",
        what, rank_, device_, current, device_);
}

void DeviceCollective::reserve(int64_t max_bytes_per_rank) {
  if (max_bytes_per_rank < 0)
    fail("DeviceCollective::reserve: negative size {}", max_bytes_per_rank);
  if (max_bytes_per_rank <= reserved_) return;
  DeviceScope scope(device_);
  // The old workspace goes first: both need not fit at once.
  workspace_ = DeviceMemory();
  reserved_ = 0;
  workspace_ = DeviceMemory(static_cast<size_t>(size_) * static_cast<size_t>(max_bytes_per_rank));
  reserved_ = max_bytes_per_rank;
}

template <class Act>
void DeviceCollective::all_reduce_sum(Act* d, int64_t n, cudaStream_t s) {
  static_assert(std::is_same_v<Act, float> || std::is_same_v<Act, __nv_bfloat16>);
  if (n < 0) fail("all_reduce_sum: negative size {}", n);
  // One rank's sum is its own partial; no NCCL call.
  if (n == 0 || size_ == 1) return;
  const int64_t bytes = n * static_cast<int64_t>(sizeof(Act));
  if (bytes > reserved_)
    fail("all_reduce_sum: {} bytes per rank, but rank {} reserved {} (DeviceCollective::reserve)",
         bytes, rank_, reserved_);
  check_device("all_reduce_sum");
  // Row r of the workspace receives rank r's d.
  check_nccl(
      nccl().all_gather(d, workspace_.as<void>(), static_cast<size_t>(bytes), kNcclInt8, comm_, s),
      "ncclAllGather", comm_);
  sum_ranks(workspace_.as<const Act>(), n, size_, d, s);
}

template void DeviceCollective::all_reduce_sum<float>(float*, int64_t, cudaStream_t);
template void DeviceCollective::all_reduce_sum<__nv_bfloat16>(__nv_bfloat16*, int64_t,
                                                              cudaStream_t);

// ---- NcclGroup ---------------------------------------------------------------

NcclGroup::NcclGroup(std::vector<int> devices) : devices_(std::move(devices)) {
  if (devices_.empty()) fail("tensor parallel: no devices given");
  int count = 0;
  QTK_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (size_t i = 0; i < devices_.size(); ++i) {
    const int d = devices_[i];
    if (d < 0 || d >= count)
      fail("tensor parallel: device {} does not exist ({} CUDA devices)", d, count);
    if (std::find(devices_.begin(), devices_.begin() + i, d) != devices_.begin() + i)
      fail("tensor parallel: device {} is listed twice", d);
  }
  const NcclApi& api = nccl();
  std::vector<ncclComm*> comms(devices_.size(), nullptr);
  {
    // ncclCommInitAll sets each device in turn; the caller's stays current.
    int current = 0;
    QTK_CUDA_CHECK(cudaGetDevice(&current));
    DeviceScope scope(current);
    check_nccl(api.comm_init_all(comms.data(), size(), devices_.data()), "ncclCommInitAll",
               nullptr);
  }
  for (int r = 0; r < size(); ++r)
    ranks_.emplace_back(new DeviceCollective(comms[r], r, size(), devices_[r]));
}

NcclGroup::~NcclGroup() {
  // note: every rank's communicator is destroyed from this one thread; NCCL
  // frees the shared resources when the process's last one goes.
  for (auto& rank : ranks_) {
    if (rank->comm_ == nullptr) continue;
    try {
      DeviceScope scope(rank->device_);
      (void)nccl().comm_destroy(rank->comm_);
    } catch (...) {
    }
    rank->comm_ = nullptr;
  }
  ranks_.clear();
}

}  // namespace qtk::cuda
