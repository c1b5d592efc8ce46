// ToxBilstm: file reader, Keras-compatible tokenizer and the BiLSTM forward. Accumulation in
// double (Keras runs f32; against its outputs the difference stays far below the 1e-5 the
// test allows), weights in the file's f32.
#include "eval/scoring/tox_bilstm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/sha256.h"

namespace snap::scoring {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

class TccScorer : public Scorer {
 public:
  explicit TccScorer(std::unique_ptr<ToxBilstm> m) : model_(std::move(m)) {
    info_.id = "tcc-toxic";
    info_.version = model_->package_version();
    info_.sha256 = model_->file_sha256();
    info_.params = {{"label", "toxic"},
                    {"threshold", 0.5},
                    {"package", "toxic-comment-classifier"},
                    {"source_sha256", model_->source_sha256()}};
  }
  const ScorerInfo& info() const override { return info_; }
  ScoreResult score(std::string_view text, std::string_view) const override {
    ScoreResult r;
    auto p = model_->classify(text);
    r.attributes = nlohmann::json::object();
    for (int i = 0; i < ToxBilstm::k_labels; ++i) r.attributes[model_->labels()[i]] = p[i];
    r.value = p[0];
    return r;
  }

 private:
  std::unique_ptr<ToxBilstm> model_;
  ScorerInfo info_;
};

}  // namespace

Result<std::unique_ptr<ToxBilstm>> ToxBilstm::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found(path + ": cannot open the classifier file (run tools/tox_convert.py; scripts/setup.sh does)");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() < 12 || bytes.compare(0, 8, "SNAPTOX1") != 0) return data_loss(path + ": not a SNAPTOX1 file");
  uint32_t hlen = 0;
  std::memcpy(&hlen, bytes.data() + 8, 4);
  if (12ull + hlen > bytes.size()) return data_loss(path + ": header of " + std::to_string(hlen) + " bytes runs past the file");
  nlohmann::json h = nlohmann::json::parse(bytes.begin() + 12, bytes.begin() + 12 + hlen, nullptr, false);
  if (h.is_discarded() || !h.is_object()) return data_loss(path + ": header is not JSON");
  auto m = std::unique_ptr<ToxBilstm>(new ToxBilstm());
  try {
    if (h.at("format") != "snaptox-bilstm-1") return data_loss(path + ": unknown format " + h.at("format").dump());
    m->package_version_ = h.at("package_version").get<std::string>();
    m->source_sha256_ = h.at("source_sha256").get<std::string>();
    m->labels_ = h.at("labels").get<std::vector<std::string>>();
    m->maxlen_ = h.at("maxlen").get<int>();
    m->num_words_ = h.at("num_words").get<int>();
    m->filters_ = h.at("filters").get<std::string>();
    m->lower_ = h.at("lower").get<bool>();
    m->split_ = h.at("split").get<std::string>();
    auto vocab = h.at("vocab").get<std::vector<std::string>>();
    if (static_cast<int>(vocab.size()) != m->num_words_ - 1) return data_loss(path + ": vocab size != num_words - 1");
    for (size_t i = 0; i < vocab.size(); ++i) m->vocab_.emplace(vocab[i], static_cast<int32_t>(i + 1));
    if (m->labels_.size() != k_labels || m->split_.size() != 1 || m->maxlen_ <= 0)
      return data_loss(path + ": labels, split or maxlen not as the network expects");
    size_t data_start = (12 + hlen + 63) / 64 * 64;
    m->data_.assign(bytes.begin() + std::min(data_start, bytes.size()), bytes.end());
    std::unordered_map<std::string, const float*> ptr;
    std::unordered_map<std::string, std::vector<int64_t>> shape;
    for (const auto& t : h.at("tensors")) {
      auto name = t.at("name").get<std::string>();
      auto sh = t.at("shape").get<std::vector<int64_t>>();
      int64_t n = 1;
      for (auto d : sh) n *= d;
      auto off = t.at("offset").get<int64_t>();
      if (off < 0 || off % 4 != 0 || off + n * 4 > static_cast<int64_t>(m->data_.size()))
        return data_loss(path + ": tensor " + name + " runs past the file");
      ptr[name] = reinterpret_cast<const float*>(m->data_.data() + off);
      shape[name] = sh;
    }
    auto want = [&](const std::string& name, std::vector<int64_t> sh) -> Status {
      if (!ptr.count(name)) return data_loss(path + ": missing tensor " + name);
      if (shape[name] != sh) return data_loss(path + ": tensor " + name + " has an unexpected shape");
      return Status();
    };
    m->embed_ = static_cast<int>(shape["embedding"].size() == 2 ? shape["embedding"][1] : 0);
    m->units_ = static_cast<int>(shape["fwd_recurrent"].size() == 2 ? shape["fwd_recurrent"][0] : 0);
    m->hidden_ = static_cast<int>(shape["dense_bias"].size() == 1 ? shape["dense_bias"][0] : 0);
    const int64_t e = m->embed_, u = m->units_, hd = m->hidden_;
    SNAP_RETURN_IF_ERROR(want("embedding", {m->num_words_, e}));
    for (const char* d : {"fwd", "bwd"}) {
      SNAP_RETURN_IF_ERROR(want(std::string(d) + "_kernel", {e, 4 * u}));
      SNAP_RETURN_IF_ERROR(want(std::string(d) + "_recurrent", {u, 4 * u}));
      SNAP_RETURN_IF_ERROR(want(std::string(d) + "_bias", {4 * u}));
    }
    SNAP_RETURN_IF_ERROR(want("dense_kernel", {2 * u, hd}));
    SNAP_RETURN_IF_ERROR(want("dense_bias", {hd}));
    SNAP_RETURN_IF_ERROR(want("out_kernel", {hd, k_labels}));
    SNAP_RETURN_IF_ERROR(want("out_bias", {k_labels}));
    m->embedding_ = ptr["embedding"];
    m->fwd_ = {ptr["fwd_kernel"], ptr["fwd_recurrent"], ptr["fwd_bias"]};
    m->bwd_ = {ptr["bwd_kernel"], ptr["bwd_recurrent"], ptr["bwd_bias"]};
    m->dense_kernel_ = ptr["dense_kernel"];
    m->dense_bias_ = ptr["dense_bias"];
    m->out_kernel_ = ptr["out_kernel"];
    m->out_bias_ = ptr["out_bias"];
  } catch (const nlohmann::json::exception& ex) {
    return data_loss(path + ": header field missing or of the wrong type (" + ex.what() + ")");
  }
  m->file_sha256_ = sha256_hex(bytes);
  return m;
}

std::vector<int32_t> ToxBilstm::tokenize(std::string_view text) const {
  // Keras text_to_word_sequence: lower(), every filter character -> split, split, drop empties.
  // Lowercasing is ASCII-only here (Python's str.lower also folds non-ASCII capitals).
  std::string t(text);
  const char sp = split_[0];
  for (char& c : t) {
    if (lower_ && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (filters_.find(c) != std::string::npos) c = sp;
  }
  std::vector<int32_t> seq;
  size_t i = 0;
  while (i <= t.size()) {
    size_t j = t.find(sp, i);
    if (j == std::string::npos) j = t.size();
    if (j > i) {
      auto it = vocab_.find(t.substr(i, j - i));
      if (it != vocab_.end()) seq.push_back(it->second);  // ids >= num_words are not in vocab_
    }
    i = j + 1;
  }
  // pad_sequences(maxlen): keep the last maxlen ids, zeros in front.
  std::vector<int32_t> ids(maxlen_, 0);
  const size_t keep = std::min(seq.size(), static_cast<size_t>(maxlen_));
  std::copy(seq.end() - keep, seq.end(), ids.end() - keep);
  return ids;
}

void ToxBilstm::run_lstm(const Lstm& w, const std::vector<int32_t>& ids, bool reverse, float* pooled) const {
  const int u = units_, g4 = 4 * units_;
  std::vector<double> h(u, 0.0), c(u, 0.0), z(g4);
  std::fill(pooled, pooled + u, -INFINITY);
  const int n = static_cast<int>(ids.size());
  for (int s = 0; s < n; ++s) {
    const int32_t id = ids[reverse ? n - 1 - s : s];
    const float* x = embedding_ + static_cast<int64_t>(id) * embed_;
    for (int j = 0; j < g4; ++j) z[j] = w.bias[j];
    for (int k = 0; k < embed_; ++k) {
      const float* row = w.kernel + static_cast<int64_t>(k) * g4;
      for (int j = 0; j < g4; ++j) z[j] += static_cast<double>(x[k]) * row[j];
    }
    for (int k = 0; k < u; ++k) {
      const float* row = w.recurrent + static_cast<int64_t>(k) * g4;
      for (int j = 0; j < g4; ++j) z[j] += h[k] * row[j];
    }
    for (int j = 0; j < u; ++j) {
      const double ig = sigmoid(z[j]), fg = sigmoid(z[u + j]), gg = std::tanh(z[2 * u + j]), og = sigmoid(z[3 * u + j]);
      c[j] = fg * c[j] + ig * gg;
      h[j] = og * std::tanh(c[j]);
      pooled[j] = std::max(pooled[j], static_cast<float>(h[j]));
    }
  }
}

std::array<float, ToxBilstm::k_labels> ToxBilstm::forward(const std::vector<int32_t>& ids) const {
  std::vector<float> pooled(2 * units_);  // [fwd | bwd], Bidirectional's concat order
  run_lstm(fwd_, ids, false, pooled.data());
  run_lstm(bwd_, ids, true, pooled.data() + units_);
  std::vector<double> hid(hidden_);
  for (int j = 0; j < hidden_; ++j) {
    double a = dense_bias_[j];
    for (int k = 0; k < 2 * units_; ++k) a += static_cast<double>(pooled[k]) * dense_kernel_[k * hidden_ + j];
    hid[j] = std::max(0.0, a);
  }
  std::array<float, k_labels> out{};
  for (int j = 0; j < k_labels; ++j) {
    double a = out_bias_[j];
    for (int k = 0; k < hidden_; ++k) a += hid[k] * out_kernel_[k * k_labels + j];
    out[j] = static_cast<float>(sigmoid(a));
  }
  return out;
}

std::array<float, ToxBilstm::k_labels> ToxBilstm::classify(std::string_view text) const { return forward(tokenize(text)); }

Result<std::unique_ptr<Scorer>> make_tcc_scorer(const std::string& path) {
  SNAP_ASSIGN_OR_RETURN(auto m, ToxBilstm::load(path));
  return std::unique_ptr<Scorer>(std::make_unique<TccScorer>(std::move(m)));
}

}  // namespace snap::scoring
