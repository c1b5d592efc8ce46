// A client of the Perspective API (or of any endpoint with its shapes, such as
// `snapserve serve --perspective-scorer`) as a Scorer: POST comments:analyze with
// PERSPECTIVE_API_KEY, a client-side rate limit (1 QPS by default, the API's quota),
// retries with exponential backoff on 429 / 5xx / network errors (Retry-After honoured),
// and every failure returned as an error with the raw response — never as a score of 0.
// The response's own metadata (languages, detectedLanguages, Date, snapserveScorer when
// present) is kept in the attributes as the version evidence.
#pragma once

#include <memory>
#include <string>

#include "eval/scoring/scorer.h"

namespace snap::scoring {

const char* k_perspective_default_url();
// invalid_argument when Google's endpoint is used without a key.
Result<std::unique_ptr<Scorer>> make_perspective_scorer(const std::string& label, const ScorerOptions& options);

}  // namespace snap::scoring
