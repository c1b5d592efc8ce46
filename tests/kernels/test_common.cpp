// common/: f16/bf16 conversions round-trip and round to nearest even; Status formatting; SHA-256.
#include <gtest/gtest.h>

#include <cmath>

#include "common/dtype.h"
#include "common/sha256.h"
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

// FIPS 180-4 / NIST CAVP vectors, and a split feed equal to a one-shot feed.
TEST(Sha256, MatchesStandardVectors) {
  EXPECT_EQ(snap::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(snap::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(snap::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  snap::Sha256 million;
  const std::string a(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.update(a);
  EXPECT_EQ(million.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  std::string text;
  for (int i = 0; i < 300; ++i) text += static_cast<char>(i * 7 + 3);
  for (size_t split : {size_t{0}, size_t{1}, size_t{55}, size_t{63}, size_t{64}, size_t{65}, size_t{200}}) {
    snap::Sha256 s;
    s.update(std::string_view(text).substr(0, split));
    s.update(std::string_view(text).substr(split));
    EXPECT_EQ(s.hex(), snap::sha256_hex(text)) << "split at " << split;
  }
}
