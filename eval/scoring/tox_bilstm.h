// The toxic-comment-classifier network (PyPI, MIT) in C++: its Keras tokenizer (lowercase,
// filter characters to spaces, split on spaces, ids < num_words, pre-pad / pre-truncate to
// 100) and its forward pass (Embedding 20000x50 -> Bidirectional LSTM(50), gates i,f,g,o,
// sigmoid/tanh, over all 100 positions incl. padding -> max over time -> Dense 50 relu ->
// Dense 6 sigmoid). Weights come from the file tools/tox_convert.py writes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "eval/scoring/scorer.h"

namespace snap::scoring {

class ToxBilstm {
 public:
  static constexpr int k_labels = 6;
  // data_loss / not_found naming the path and what is wrong.
  static Result<std::unique_ptr<ToxBilstm>> load(const std::string& path);

  // Token ids exactly as the package's tokenizer + pad_sequences produce them: [maxlen].
  std::vector<int32_t> tokenize(std::string_view text) const;
  // The six label probabilities for one text.
  std::array<float, k_labels> classify(std::string_view text) const;
  std::array<float, k_labels> forward(const std::vector<int32_t>& ids) const;

  const std::vector<std::string>& labels() const { return labels_; }
  const std::string& package_version() const { return package_version_; }
  const std::string& source_sha256() const { return source_sha256_; }
  const std::string& file_sha256() const { return file_sha256_; }

 private:
  ToxBilstm() = default;
  struct Lstm {
    const float* kernel = nullptr;     // [embed, 4*units]
    const float* recurrent = nullptr;  // [units, 4*units]
    const float* bias = nullptr;       // [4*units]
  };
  // Runs one direction over ids (reversed when `reverse`), max-pooling h into pooled[units].
  void run_lstm(const Lstm& w, const std::vector<int32_t>& ids, bool reverse, float* pooled) const;

  std::vector<char> data_;  // the file's tensor bytes, 64-byte aligned start
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> labels_;
  std::string filters_, split_ = " ", package_version_, source_sha256_, file_sha256_;
  bool lower_ = true;
  int maxlen_ = 100, num_words_ = 20000, embed_ = 50, units_ = 50, hidden_ = 50;
  const float* embedding_ = nullptr;  // [num_words, embed]
  Lstm fwd_, bwd_;
  const float* dense_kernel_ = nullptr;  // [2*units, hidden]
  const float* dense_bias_ = nullptr;    // [hidden]
  const float* out_kernel_ = nullptr;    // [hidden, labels]
  const float* out_bias_ = nullptr;      // [labels]
};

// The scorer "tcc-toxic@<package version>": value = the "toxic" label's probability,
// attributes = all six labels; sha256 = the converted file's; params name the source file's.
Result<std::unique_ptr<Scorer>> make_tcc_scorer(const std::string& path);

}  // namespace snap::scoring
