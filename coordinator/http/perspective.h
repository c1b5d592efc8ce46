// The Perspective-compatible endpoint of `snapserve serve`: POST
// /v1alpha1/comments:analyze with the request and response shapes of Google's Perspective
// API (comment.text, requestedAttributes {NAME: {scoreType, scoreThreshold}}, languages,
// spanAnnotations, doNotStore, clientToken -> attributeScores.NAME.summaryScore.value,
// languages, detectedLanguages, clientToken; errors as {"error": {code, message, status}}),
// answered by a local, pinned scorer. The response adds "snapserveScorer" {id, version,
// sha256}: the version evidence the real API never gives. An optional quota answers 429
// RESOURCE_EXHAUSTED past `qps` requests per second, as the real API does.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "eval/scoring/scorer.h"

namespace snap {

struct PerspectiveReply {
  int status = 200;
  std::string body;  // JSON
};

class PerspectiveHandler {
 public:
  static constexpr const char* k_path = "/v1alpha1/comments:analyze";
  // api_key: when not empty, requests must carry ?key=API_KEY (403 otherwise). qps <= 0: no quota.
  PerspectiveHandler(std::unique_ptr<scoring::Scorer> scorer, std::string api_key, double qps);
  // `target` is the request target (path + query), `body` the JSON body. Thread-safe.
  PerspectiveReply analyze(const std::string& target, const std::string& body) const;
  const scoring::ScorerInfo& scorer_info() const { return scorer_->info(); }

 private:
  bool take_quota() const;
  std::unique_ptr<scoring::Scorer> scorer_;
  std::string api_key_;
  double qps_;
  mutable std::mutex mu_;
  mutable double tokens_ = 0;
  mutable std::chrono::steady_clock::time_point last_{};
};

}  // namespace snap
