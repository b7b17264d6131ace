// A minimal JSON value for the command line's --json output: objects keep
// insertion order. Not a parser.
#ifndef KREG_TOOLS_JSON_H_
#define KREG_TOOLS_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace kreg {

class Json {
 public:
  Json() = default;
  Json(bool b) : v_(b) {}                        // NOLINT
  Json(int64_t i) : v_(i) {}                     // NOLINT
  Json(double d) : v_(d) {}                      // NOLINT
  Json(std::string s) : v_(std::move(s)) {}      // NOLINT
  Json(const char* s) : v_(std::string(s)) {}    // NOLINT

  static Json Object() { Json j; j.v_ = Members(); return j; }
  static Json Array() { Json j; j.v_ = Items(); return j; }

  // REQUIRES: an object.
  Json& Set(std::string key, Json value) {
    std::get<Members>(v_).emplace_back(std::move(key), std::move(value));
    return *this;
  }
  // REQUIRES: an array.
  Json& Push(Json value) {
    std::get<Items>(v_).push_back(std::move(value));
    return *this;
  }
  std::string Dump() const {
    std::string out;
    DumpTo(out);
    return out;
  }

 private:
  using Members = std::vector<std::pair<std::string, Json>>;
  using Items = std::vector<Json>;

  static void Quote(const std::string& s, std::string& out) {
    out += '"';
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += static_cast<char>(c);
      }
    }
    out += '"';
  }

  void DumpTo(std::string& out) const {
    if (std::holds_alternative<std::monostate>(v_)) out += "null";
    if (auto* b = std::get_if<bool>(&v_)) out += *b ? "true" : "false";
    if (auto* i = std::get_if<int64_t>(&v_)) out += std::to_string(*i);
    if (auto* d = std::get_if<double>(&v_)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", *d);
      out += buf;
    }
    if (auto* s = std::get_if<std::string>(&v_)) Quote(*s, out);
    if (auto* a = std::get_if<Items>(&v_)) {
      out += '[';
      for (size_t i = 0; i < a->size(); ++i) {
        if (i) out += ',';
        (*a)[i].DumpTo(out);
      }
      out += ']';
    }
    if (auto* o = std::get_if<Members>(&v_)) {
      out += '{';
      for (size_t i = 0; i < o->size(); ++i) {
        if (i) out += ',';
        Quote((*o)[i].first, out);
        out += ':';
        (*o)[i].second.DumpTo(out);
      }
      out += '}';
    }
  }

  std::variant<std::monostate, bool, int64_t, double, std::string, Members, Items> v_;
};

}  // namespace kreg

#endif  // KREG_TOOLS_JSON_H_
