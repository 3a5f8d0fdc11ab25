#include "tessera/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>
#include <vector>

#include "tessera/core/error.h"

// From src/tessera/cuda/CMakeLists.txt: the soname of the toolkit's cuBLAS ("libcublas.so.13"),
// the full path of the copy the build found ("" when none) and the toolkit's major version.
#if !defined(TESSERA_CUBLAS_SONAME) || !defined(TESSERA_CUBLAS_PATH) || !defined(TESSERA_CUDA_MAJOR)
#error "TESSERA_CUBLAS_SONAME, TESSERA_CUBLAS_PATH and TESSERA_CUDA_MAJOR come from CMake"
#endif

namespace tessera::cuda {
namespace {

std::string dl_error() {
  const char* e = dlerror();
  return e != nullptr ? e : "no message";
}

// Looks `name` up in `lib` into `fn`, or adds the name to `missing`.
template <typename F>
void resolve(void* lib, const char* name, F& fn, std::vector<std::string>& missing) {
  void* p = dlsym(lib, name);
  if (p == nullptr)
    missing.push_back(name);
  else
    fn = reinterpret_cast<F>(p);
}

}  // namespace

CublasLibrary load_cublas(const std::vector<std::string>& files) {
  std::vector<std::string> tried;
  void* lib = nullptr;
  std::string opened;
  for (const std::string& file : files) {
    // RTLD_NOW: a library that cannot bind its own dependencies fails here, with a message, and
    // not at its first call.
    lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      opened = file;
      break;
    }
    tried.push_back(dl_error());  // "<file>: cannot open shared object file: ..."
  }
  TESSERA_CHECK(lib != nullptr, "cannot load cuBLAS (", detail::join(tried, "; "),
                "): --device cuda needs the CUDA ", TESSERA_CUDA_MAJOR,
                " toolkit's libraries on the loader path (LD_LIBRARY_PATH or ld.so.conf)");

  // The exported name as cublas_v2.h spells the call: cublasCreate is cublasCreate_v2.
#define TESSERA_CUBLAS_SYMBOL(f) TESSERA_CUBLAS_STRING(f)
#define TESSERA_CUBLAS_STRING(f) #f
#define TESSERA_CUBLAS_RESOLVE(member, f) \
  resolve(lib, TESSERA_CUBLAS_SYMBOL(f), table.member, missing)
  CublasLibrary table{};
  std::vector<std::string> missing;
  TESSERA_CUBLAS_RESOLVE(create, cublasCreate);
  TESSERA_CUBLAS_RESOLVE(destroy, cublasDestroy);
  TESSERA_CUBLAS_RESOLVE(set_stream, cublasSetStream);
  TESSERA_CUBLAS_RESOLVE(set_workspace, cublasSetWorkspace);
  TESSERA_CUBLAS_RESOLVE(set_math_mode, cublasSetMathMode);
  TESSERA_CUBLAS_RESOLVE(gemm_ex, cublasGemmEx);
  TESSERA_CUBLAS_RESOLVE(gemm_strided_batched_ex, cublasGemmStridedBatchedEx);
  TESSERA_CUBLAS_RESOLVE(get_status_name, cublasGetStatusName);
#undef TESSERA_CUBLAS_RESOLVE
#undef TESSERA_CUBLAS_STRING
#undef TESSERA_CUBLAS_SYMBOL
  if (!missing.empty()) {
    (void)dlclose(lib);
    throw Error(detail::concat("cannot load cuBLAS: ", opened, " lacks ",
                               detail::join(missing, ", "), ": tessera was built against the CUDA ",
                               TESSERA_CUDA_MAJOR, " toolkit's cuBLAS"));
  }
  return table;  // the library stays open: handles and their kernels live until the process ends
}

const CublasLibrary& cublas_library() {
  // The soname first, as the linked binary found it (LD_LIBRARY_PATH, RUNPATH, ld.so.cache), then
  // the build's copy by full path, for where none of those lists the toolkit's folder.
  static const CublasLibrary table = [] {
    std::vector<std::string> files{TESSERA_CUBLAS_SONAME};
    if (files[0] != TESSERA_CUBLAS_PATH && std::string(TESSERA_CUBLAS_PATH) != "")
      files.push_back(TESSERA_CUBLAS_PATH);
    return load_cublas(files);
  }();  // once; a load that throws is tried again at the next call
  return table;
}

}  // namespace tessera::cuda
