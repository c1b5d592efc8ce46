// common/: f16/bf16 conversions round-trip and round to nearest even; Status formatting.
#include <gtest/gtest.h>

#include <cmath>

#include "common/dtype.h"
#include "common/status.h"

namespace snap {

TEST(DType, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    const float f = f16_to_f32(x);
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), x) << "h=" << h;
  }
}

TEST(DType, Bf16RoundTripsAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f), h);
  }
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
}

TEST(Status, ResultCarriesValueOrError) {
  Result<int> ok = 3;
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.value(), 3);
  Result<int> bad = not_found("m.gguf: no such file");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().to_string(), "not_found: m.gguf: no such file");
}

}  // namespace snap
