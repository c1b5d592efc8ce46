// PerspectiveHandler: validation in the API's terms (400 INVALID_ARGUMENT naming the field),
// attribute names mapped onto the local classifier's labels, summary (and, with
// spanAnnotations, one whole-text span) scores of type PROBABILITY.
#include "coordinator/http/perspective.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

namespace snap {
namespace {

using nlohmann::json;

// Perspective attribute -> the toxic-comment-classifier label that answers it.
const std::map<std::string, std::string>& attribute_labels() {
  static const std::map<std::string, std::string> m = {
      {"TOXICITY", "toxic"},  {"SEVERE_TOXICITY", "severe_toxic"}, {"PROFANITY", "obscene"},
      {"THREAT", "threat"},   {"INSULT", "insult"},                {"IDENTITY_ATTACK", "identity_hate"}};
  return m;
}

PerspectiveReply error_reply(int code, const std::string& status, const std::string& message) {
  return {code, json{{"error", {{"code", code}, {"message", message}, {"status", status}}}}.dump()};
}

PerspectiveReply bad(const std::string& message) { return error_reply(400, "INVALID_ARGUMENT", message); }

std::string query_param(const std::string& target, const std::string& name) {
  const auto q = target.find('?');
  if (q == std::string::npos) return "";
  size_t i = q + 1;
  while (i < target.size()) {
    size_t amp = target.find('&', i);
    if (amp == std::string::npos) amp = target.size();
    const std::string kv = target.substr(i, amp - i);
    if (kv.rfind(name + "=", 0) == 0) return kv.substr(name.size() + 1);
    i = amp + 1;
  }
  return "";
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

PerspectiveHandler::PerspectiveHandler(std::unique_ptr<scoring::Scorer> scorer, std::string api_key, double qps)
    : scorer_(std::move(scorer)), api_key_(std::move(api_key)), qps_(qps), tokens_(qps) {}

bool PerspectiveHandler::take_quota() const {
  if (qps_ <= 0) return true;
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (last_ != std::chrono::steady_clock::time_point{}) {
    tokens_ = std::min(qps_, tokens_ + std::chrono::duration<double>(now - last_).count() * qps_);
  }
  last_ = now;
  if (tokens_ < 1.0) return false;
  tokens_ -= 1.0;
  return true;
}

PerspectiveReply PerspectiveHandler::analyze(const std::string& target, const std::string& body) const {
  if (!api_key_.empty() && query_param(target, "key") != api_key_) {
    return error_reply(403, "PERMISSION_DENIED", "API key not valid. Please pass a valid API key (?key=...).");
  }
  if (!take_quota()) {
    char m[96];
    std::snprintf(m, sizeof m, "Quota exceeded: more than %g requests per second", qps_);
    return error_reply(429, "RESOURCE_EXHAUSTED", m);
  }
  json req = json::parse(body, nullptr, false);
  if (req.is_discarded() || !req.is_object()) return bad("Invalid JSON payload received: the body is not a JSON object");
  for (auto it = req.begin(); it != req.end(); ++it) {
    static const char* known[] = {"comment", "requestedAttributes", "languages", "spanAnnotations", "doNotStore",
                                  "clientToken", "sessionId", "communityId", "context"};
    if (std::find(std::begin(known), std::end(known), it.key()) == std::end(known)) {
      return bad("Invalid JSON payload received. Unknown name \"" + it.key() + "\": Cannot find field.");
    }
  }
  if (!req.contains("comment") || !req["comment"].is_object() || !req["comment"].contains("text") ||
      !req["comment"]["text"].is_string()) {
    return bad("comment.text is required and must be a string");
  }
  const std::string text = req["comment"]["text"].get<std::string>();
  if (text.empty()) return bad("Comment must be non-empty.");
  if (text.size() > 20480) return bad("Comment text too long: " + std::to_string(text.size()) + " bytes (limit 20480)");
  if (req["comment"].contains("type") && req["comment"]["type"] != "PLAIN_TEXT") {
    return bad("comment.type " + req["comment"]["type"].dump() + " is not supported (PLAIN_TEXT only)");
  }
  if (!req.contains("requestedAttributes") || !req["requestedAttributes"].is_object() || req["requestedAttributes"].empty()) {
    return bad("requestedAttributes must name at least one attribute");
  }
  json languages = json::array({"en"});
  if (req.contains("languages")) {
    if (!req["languages"].is_array()) return bad("languages must be a list of language codes");
    for (const auto& l : req["languages"]) {
      if (!l.is_string() || l != "en") {
        return bad("Attribute " + req["requestedAttributes"].begin().key() + " does not support request languages: " +
                   (l.is_string() ? l.get<std::string>() : l.dump()));
      }
    }
    if (!req["languages"].empty()) languages = req["languages"];
  }
  for (const char* b : {"spanAnnotations", "doNotStore"}) {
    if (req.contains(b) && !req[b].is_boolean()) return bad(std::string(b) + " must be true or false");
  }
  const bool spans = req.value("spanAnnotations", false);
  auto r = scorer_->score(text, "");
  if (!r.error.ok()) return error_reply(500, "INTERNAL", "scorer " + scorer_->info().key() + ": " + r.error.message());
  json scores = json::object();
  for (auto it = req["requestedAttributes"].begin(); it != req["requestedAttributes"].end(); ++it) {
    const std::string name = it.key();
    const auto& opt = it.value();
    if (!opt.is_object()) return bad("requestedAttributes." + name + " must be an object");
    auto label = attribute_labels().find(name);
    const bool have = label != attribute_labels().end() &&
                      (r.attributes.is_object() ? r.attributes.contains(label->second) : name == "TOXICITY");
    if (!have) {
      return bad("Requested attribute " + name + " does not exist in language en for scorer " + scorer_->info().key());
    }
    if (opt.contains("scoreType") && opt["scoreType"] != "PROBABILITY") {
      return bad("requestedAttributes." + name + ".scoreType " + opt["scoreType"].dump() + " is not supported (PROBABILITY)");
    }
    double threshold = 0;
    if (opt.contains("scoreThreshold")) {
      if (!opt["scoreThreshold"].is_number()) return bad("requestedAttributes." + name + ".scoreThreshold must be a number");
      threshold = opt["scoreThreshold"].get<double>();
    }
    const double v = r.attributes.is_object() ? r.attributes[label->second].get<double>() : r.value;
    if (v < threshold) continue;  // the API leaves out attributes under their threshold
    json a = {{"summaryScore", {{"value", v}, {"type", "PROBABILITY"}}}};
    if (spans) {
      a["spanScores"] = json::array({{{"begin", 0}, {"end", utf8_length(text)}, {"score", {{"value", v}, {"type", "PROBABILITY"}}}}});
    }
    scores[name] = a;
  }
  json resp = {{"attributeScores", scores}, {"languages", languages}, {"detectedLanguages", languages},
               {"snapserveScorer",
                {{"id", scorer_->info().id}, {"version", scorer_->info().version}, {"sha256", scorer_->info().sha256}}}};
  if (req.contains("clientToken")) resp["clientToken"] = req["clientToken"];
  return {200, resp.dump()};
}

}  // namespace snap
