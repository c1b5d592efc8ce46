// One process's KV selection against a tensor-parallel group's, from `generate
// --dump-kv-selection FILE` (worker/device/device_generate.cpp: the kept prompt positions in
// ascending order per layer and KV head): one process writes FILE with every KV head; rank r of
// a group writes FILE.rank<r> with its own.
// The e2e device tests' models have one KV head per rank, so rank r's head is KV head r.
// Used where two processes may keep another entry than one at a near-tie at a head's cut-off
// (the row-parallel sums add in another order): the tests allow that much and no more.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace snap::testing {

// Adds to *total the entries one process keeps and to *differ those that one process and the
// group do not both keep, over every layer and KV head (`ranks` ranks, one KV head each).
inline void count_selection_difference(const std::filesystem::path& one, const std::filesystem::path& group, int ranks,
                                       int64_t* total, int64_t* differ) {
  const auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  };
  ASSERT_TRUE(std::filesystem::exists(one)) << one;
  const nlohmann::json whole = read(one);
  ASSERT_FALSE(whole.is_discarded()) << one;
  for (int r = 0; r < ranks; ++r) {
    const std::filesystem::path p = group.string() + ".rank" + std::to_string(r);
    ASSERT_TRUE(std::filesystem::exists(p)) << p;
    const nlohmann::json part = read(p);
    ASSERT_FALSE(part.is_discarded()) << p;
    ASSERT_EQ(part["layers"].size(), whole["layers"].size()) << p;
    for (size_t l = 0; l < whole["layers"].size(); ++l) {
      const auto& heads = part["layers"][l]["heads"];
      ASSERT_EQ(heads.size(), 1u) << "rank " << r << " holds one KV head";
      const auto x = whole["layers"][l]["heads"][r].get<std::vector<int32_t>>();
      const auto y = heads[0].get<std::vector<int32_t>>();
      EXPECT_EQ(x.size(), y.size()) << "layer " << l << " KV head " << r;
      std::vector<int32_t> common;
      std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(common));
      *total += static_cast<int64_t>(x.size());
      *differ += static_cast<int64_t>(std::max(x.size(), y.size()) - common.size());
    }
  }
}

}  // namespace snap::testing
