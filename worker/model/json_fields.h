// Typed access to a Hugging Face config.json's fields: missing required fields are
// not_found and wrong types invalid_argument, each one line naming the file and the field.
// Shared by config.cpp (every architecture) and gemma3_config.cpp (Gemma 3's own fields).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace snap {

class JsonFields {
 public:
  JsonFields(const std::string& path, const nlohmann::json& j) : path_(path), j_(j) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  Result<int64_t> req_int(const char* key) const {
    if (!has(key)) return not_found(path_ + ": missing field '" + key + "'");
    return as_int(key, j_[key]);
  }
  Result<int64_t> opt_int(const char* key, int64_t def) const {
    return has(key) ? as_int(key, j_[key]) : Result<int64_t>(def);
  }
  Result<double> opt_float(const char* key, double def) const {
    if (!has(key)) return def;
    return as_float(key, j_[key]);
  }
  Result<std::string> opt_string(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    if (!j_[key].is_string())
      return invalid_argument(path_ + ": field '" + key + "' must be a string, got " + j_[key].dump());
    return j_[key].get<std::string>();
  }
  Result<bool> opt_bool(const char* key, bool def) const {
    if (!has(key)) return def;
    if (!j_[key].is_boolean()) return invalid_argument(path_ + ": field '" + key + "' must be true or false");
    return j_[key].get<bool>();
  }

  Result<int64_t> as_int(const std::string& key, const nlohmann::json& v) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    // Some exporters write integral values as floats (e.g. 8192.0).
    if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
        std::fabs(v.get<double>()) < 9e15)
      return static_cast<int64_t>(v.get<double>());
    return invalid_argument(path_ + ": field '" + key + "' must be an integer, got " + v.dump());
  }
  Result<double> as_float(const std::string& key, const nlohmann::json& v) const {
    if (v.is_number()) return v.get<double>();
    return invalid_argument(path_ + ": field '" + key + "' must be a number, got " + v.dump());
  }

 private:
  const std::string& path_;
  const nlohmann::json& j_;
};

}  // namespace snap
