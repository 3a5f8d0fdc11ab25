#include "tessera/cuda/cublas_library.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>

#include "tessera/core/error.h"

// No device needed: opening cuBLAS and looking its functions up needs the toolkit's libraries
// only, so these run (and do not skip) on machines without a GPU.
namespace tessera::cuda {
namespace {

TEST(CublasLibrary, OpensAndResolvesEveryFunction) {
  const CublasLibrary& lib = cublas_library();
  EXPECT_NE(lib.create, nullptr);
  EXPECT_NE(lib.destroy, nullptr);
  EXPECT_NE(lib.set_stream, nullptr);
  EXPECT_NE(lib.set_workspace, nullptr);
  EXPECT_NE(lib.set_math_mode, nullptr);
  EXPECT_NE(lib.gemm_ex, nullptr);
  EXPECT_NE(lib.gemm_strided_batched_ex, nullptr);
  EXPECT_NE(lib.get_status_name, nullptr);
  EXPECT_EQ(&cublas_library(), &lib);  // opened once
}

TEST(CublasLibrary, CallsThroughTheTable) {
  const CublasLibrary& lib = cublas_library();
  EXPECT_STREQ(lib.get_status_name(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(lib.get_status_name(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
}

TEST(CublasLibrary, AMissingFileIsNamed) {
  try {
    (void)load_cublas({"libtessera_no_such_cublas.so.13", "/nonexistent/libcublas.so.13"});
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("cannot load cuBLAS (libtessera_no_such_cublas.so.13: ", 0), 0) << what;
    EXPECT_NE(what.find("; /nonexistent/libcublas.so.13: "), std::string::npos) << what;
    EXPECT_NE(what.find("): --device cuda needs the CUDA "), std::string::npos) << what;
  }
}

TEST(CublasLibrary, ALibraryWithoutTheFunctionsIsRefused) {
  try {
    (void)load_cublas({"libm.so.6"});
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("cannot load cuBLAS: libm.so.6 lacks cublasCreate_v2, cublasDestroy_v2, "
                         "cublasSetStream_v2, cublasSetWorkspace_v2, cublasSetMathMode, "
                         "cublasGemmEx, cublasGemmStridedBatchedEx, cublasGetStatusName: ",
                         0),
              0)
        << what;
  }
}

// A process that links tessera_cuda (this one, as the tessera command) maps no cuBLAS at start:
// the dynamic loader, asked to list what it loads for this executable (what ldd does), names no
// libcublas. Another process, so the tests above that open it do not count.
TEST(CublasLibrary, NotMappedAtStart) {
  std::array<char, 4096> exe{};
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  ASSERT_GT(n, 0);
  std::string quoted = "'";
  for (char c : std::string(exe.data(), static_cast<size_t>(n)))
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  FILE* p = popen(("LD_TRACE_LOADED_OBJECTS=1 " + quoted + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string listing;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) listing += buf.data();
  EXPECT_EQ(pclose(p), 0) << listing;
  EXPECT_NE(listing.find("libc.so"), std::string::npos) << "not the loader's listing:\n" << listing;
  EXPECT_EQ(listing.find("libcublas"), std::string::npos) << listing;
}

}  // namespace
}  // namespace tessera::cuda
