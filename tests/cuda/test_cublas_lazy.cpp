// cuBLAS is opened on first use (kernels/cuda/cublas_lazy.h), not linked: a process with the
// CUDA kernels starts without libcublas / libcublasLt mapped (they cost ~150 MiB of resident
// memory), and the first call loads them. Needs no GPU: loading is not using.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "kernels/cuda/cublas_lazy.h"

namespace snap::kernels {
namespace {

std::string maps() {
  std::ifstream in("/proc/self/maps");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CublasLazy, NotMappedUntilFirstUseThenLoaded) {
  EXPECT_EQ(maps().find("libcublas"), std::string::npos) << "libcublas is mapped at start";
  EXPECT_FALSE(cublas_loaded());
  ASSERT_TRUE(cublas_load()) << cublas_load_error();
  EXPECT_TRUE(cublas_loaded());
  EXPECT_EQ(cublas_load_error(), "");
  EXPECT_NE(maps().find("libcublasLt"), std::string::npos);
}

}  // namespace
}  // namespace snap::kernels

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
