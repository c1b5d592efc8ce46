// PerspectiveClient over libcurl. One request at a time per client (the rate limit is a
// minimum interval between request starts); backoff waits count against no one else.
#include "eval/scoring/perspective_client.h"

#include <curl/curl.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/sha256.h"

namespace snap::scoring {
namespace {

using clock_type = std::chrono::steady_clock;

size_t on_body(char* p, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(p, size * n);
  return size * n;
}

struct Headers {
  std::string date;
  double retry_after = -1;
};

size_t on_header(char* p, size_t size, size_t n, void* user) {
  std::string h(p, size * n);
  auto* out = static_cast<Headers*>(user);
  auto lower = h;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto value = [&](size_t skip) {
    std::string v = h.substr(skip);
    while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.pop_back();
    while (!v.empty() && v.front() == ' ') v.erase(v.begin());
    return v;
  };
  if (lower.rfind("date:", 0) == 0) out->date = value(5);
  if (lower.rfind("retry-after:", 0) == 0) out->retry_after = std::atof(value(12).c_str());
  return size * n;
}

class PerspectiveClient : public Scorer {
 public:
  PerspectiveClient(const std::string& label, const ScorerOptions& o, std::string url, std::string key)
      : o_(o), url_(std::move(url)), key_(std::move(key)) {
    info_.id = "perspective";
    info_.version = label;
    info_.params = {{"url", url_}, {"attribute", o.perspective_attribute}, {"threshold", 0.5},
                    {"qps", o.perspective_qps}, {"retries", o.perspective_retries}};
    // A remote model has no weights to hash: the fingerprint is of what we asked whom.
    info_.sha256 = sha256_hex("perspective " + url_ + " " + o.perspective_attribute);
  }
  const ScorerInfo& info() const override { return info_; }

  ScoreResult score(std::string_view text, std::string_view) const override {
    std::lock_guard<std::mutex> lock(mu_);
    ScoreResult r;
    const nlohmann::json body = {{"comment", {{"text", std::string(text)}}},
                                 {"requestedAttributes", {{o_.perspective_attribute, nlohmann::json::object()}}},
                                 {"languages", {"en"}},
                                 {"doNotStore", true}};
    const std::string payload = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    const std::string url = key_.empty() ? url_ : url_ + (url_.find('?') == std::string::npos ? "?" : "&") + "key=" + key_;
    for (int attempt = 0;; ++attempt) {
      wait_for_slot();
      std::string resp;
      Headers hdr;
      long code = 0;
      CURL* c = curl_easy_init();
      if (!c) {
        r.error = internal_error("perspective: curl_easy_init failed");
        return r;
      }
      curl_slist* h = curl_slist_append(nullptr, "Content-Type: application/json");
      curl_easy_setopt(c, CURLOPT_URL, url.c_str());
      curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, payload.c_str());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(payload.size()));
      curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
      curl_easy_setopt(c, CURLOPT_WRITEDATA, &resp);
      curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
      curl_easy_setopt(c, CURLOPT_HEADERDATA, &hdr);
      curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(o_.perspective_timeout * 1000));
      curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
      const CURLcode rc = curl_easy_perform(c);
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
      curl_slist_free_all(h);
      curl_easy_cleanup(c);
      const bool retryable = rc != CURLE_OK || code == 429 || code >= 500;
      if (retryable && attempt < o_.perspective_retries) {
        double wait = o_.perspective_backoff * std::pow(2.0, attempt);
        if (hdr.retry_after >= 0) wait = std::max(wait, hdr.retry_after);
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        continue;
      }
      r.raw = resp;
      const std::string tries = " after " + std::to_string(attempt + 1) + " attempt" + (attempt ? "s" : "");
      if (rc != CURLE_OK) {
        r.error = unavailable("perspective: " + std::string(curl_easy_strerror(rc)) + tries);
        return r;
      }
      auto j = nlohmann::json::parse(resp, nullptr, false);
      if (code != 200) {
        std::string msg = j.is_object() && j.contains("error") ? j["error"].value("message", std::string()) : resp.substr(0, 200);
        r.error = Status(code == 429 ? StatusCode::k_resource_exhausted : code >= 500 ? StatusCode::k_unavailable
                                                                                      : StatusCode::k_invalid_argument,
                         "perspective: HTTP " + std::to_string(code) + ": " + msg + tries);
        return r;
      }
      const auto ptr = nlohmann::json::json_pointer("/attributeScores/" + o_.perspective_attribute + "/summaryScore/value");
      if (j.is_discarded() || !j.contains(ptr) || !j[ptr].is_number()) {
        r.error = data_loss("perspective: HTTP 200 without attributeScores." + o_.perspective_attribute + ".summaryScore.value");
        return r;
      }
      r.value = j[ptr].get<double>();
      r.attributes = {{o_.perspective_attribute, r.value}, {"attempts", attempt + 1}};
      for (const char* k : {"languages", "detectedLanguages", "snapserveScorer"}) {
        if (j.contains(k)) r.attributes[k] = j[k];
      }
      if (!hdr.date.empty()) r.attributes["date"] = hdr.date;
      return r;
    }
  }

 private:
  void wait_for_slot() const {
    if (o_.perspective_qps <= 0) return;
    const auto now = clock_type::now();
    if (now < next_) std::this_thread::sleep_until(next_);
    next_ = std::max(now, next_) + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(1.0 / o_.perspective_qps));
  }
  ScorerOptions o_;
  std::string url_, key_;
  ScorerInfo info_;
  mutable std::mutex mu_;
  mutable clock_type::time_point next_{};
};

}  // namespace

const char* k_perspective_default_url() { return "https://commentanalyzer.googleapis.com/v1alpha1/comments:analyze"; }

Result<std::unique_ptr<Scorer>> make_perspective_scorer(const std::string& label, const ScorerOptions& o) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  std::string url = o.perspective_url;
  if (url.empty()) {
    const char* e = std::getenv("PERSPECTIVE_API_URL");
    url = e && *e ? e : k_perspective_default_url();
  }
  std::string key = o.perspective_key;
  if (key.empty()) {
    if (const char* e = std::getenv("PERSPECTIVE_API_KEY")) key = e;
  }
  if (key.empty() && url == k_perspective_default_url()) {
    return invalid_argument("perspective@" + label + ": PERSPECTIVE_API_KEY is not set (or point PERSPECTIVE_API_URL at "
                            "a Perspective-compatible endpoint such as snapserve serve --perspective-scorer)");
  }
  return std::unique_ptr<Scorer>(std::make_unique<PerspectiveClient>(label, o, url, key));
}

}  // namespace snap::scoring
