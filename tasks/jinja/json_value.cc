#include "tasks/jinja/json_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "tasks/jinja/errors.h"
#include "tasks/jinja/python_ops.h"
#include "tasks/jinja/python_text.h"
#include "tasks/jinja/unicode.h"

namespace kappa::tasks::jinja {
namespace {

void AppendEscape(char32_t c, std::string* out) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(c));
  out->append(buffer);
}

// json's encode_basestring / encode_basestring_ascii.
std::string QuoteString(const std::string& text, bool ensure_ascii) {
  std::string out = "\"";
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t c = NextCodePoint(text, &pos);
    switch (c) {
      case '"': out.append("\\\""); continue;
      case '\\': out.append("\\\\"); continue;
      case '\n': out.append("\\n"); continue;
      case '\r': out.append("\\r"); continue;
      case '\t': out.append("\\t"); continue;
      case '\b': out.append("\\b"); continue;
      case '\f': out.append("\\f"); continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
      if (c > 0xFFFF) {
        const char32_t v = c - 0x10000;
        AppendEscape(0xD800 | (v >> 10), &out);
        AppendEscape(0xDC00 | (v & 0x3FF), &out);
      } else {
        AppendEscape(c, &out);
      }
    } else {
      out.append(text, start, pos - start);
    }
  }
  return out + "\"";
}

std::string FloatText(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return FloatRepr(value);
}

std::string KeyText(const Value& key) {
  switch (key.kind()) {
    case Kind::kString: return key.as_string();
    case Kind::kFloat: return FloatText(key.as_float());
    case Kind::kBool: return key.as_bool() ? "true" : "false";
    case Kind::kInt: return std::to_string(key.as_int());
    case Kind::kNone: return "null";
    default:
      ThrowTypeError("keys must be str, int, float, bool or None, not " + TypeName(key));
  }
}

class Encoder {
 public:
  explicit Encoder(const JsonDumpOptions& options)
      : options_(options),
        item_separator_(options.item_separator
                            ? *options.item_separator
                            : (options.indent ? std::string(",") : std::string(", "))) {}

  void Encode(const Value& value, int depth, std::string* out) const {
    switch (value.kind()) {
      case Kind::kNone: out->append("null"); return;
      case Kind::kBool: out->append(value.as_bool() ? "true" : "false"); return;
      case Kind::kInt: out->append(std::to_string(value.as_int())); return;
      case Kind::kFloat: out->append(FloatText(value.as_float())); return;
      case Kind::kString: out->append(QuoteString(value.as_string(), options_.ensure_ascii)); return;
      case Kind::kTuple: EncodeArray(value.items(), depth, out); return;
      case Kind::kList:
        if (value.as_sequence().flavor == ListFlavor::kList) {
          EncodeArray(value.items(), depth, out);
          return;
        }
        break;
      case Kind::kDict: EncodeObject(value.as_dict(), depth, out); return;
      default: break;
    }
    ThrowTypeError("Object of type " + TypeName(value) + " is not JSON serializable");
  }

 private:
  // The text between items (and after the opening bracket, when indenting).
  std::string Newline(int depth) const {
    std::string text = "\n";
    for (int i = 0; i < depth; ++i) text += *options_.indent;
    return text;
  }

  void EncodeArray(const std::vector<Value>& items, int depth, std::string* out) const {
    if (items.empty()) {
      out->append("[]");
      return;
    }
    out->push_back('[');
    const std::string inner = options_.indent ? Newline(depth + 1) : "";
    out->append(inner);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out->append(item_separator_).append(inner);
      Encode(items[i], depth + 1, out);
    }
    if (options_.indent) out->append(Newline(depth));
    out->push_back(']');
  }

  void EncodeObject(const Dict& dict, int depth, std::string* out) const {
    if (dict.size() == 0) {
      out->append("{}");
      return;
    }
    std::vector<const std::pair<Value, Value>*> entries;
    for (const auto& entry : dict.entries()) entries.push_back(&entry);
    if (options_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) {
        return Compare(CompareOp::kLt, a->first, b->first);
      });
    }
    out->push_back('{');
    const std::string inner = options_.indent ? Newline(depth + 1) : "";
    out->append(inner);
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) out->append(item_separator_).append(inner);
      out->append(QuoteString(KeyText(entries[i]->first), options_.ensure_ascii));
      out->append(options_.key_separator);
      Encode(entries[i]->second, depth + 1, out);
    }
    if (options_.indent) out->append(Newline(depth));
    out->push_back('}');
  }

  const JsonDumpOptions& options_;
  std::string item_separator_;
};

// Finds integer literals too large for int64/uint64: nlohmann reports them
// as floats, with their raw text.
class IntegerOverflowFinder : public nlohmann::json_sax<nlohmann::ordered_json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t& raw) override {
    if (raw.find_first_of(".eE") == string_t::npos) overflowing = raw;
    return true;
  }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
  std::string overflowing;
};

}  // namespace

Value ParseJson(std::string_view text) {
  IntegerOverflowFinder finder;
  if (!nlohmann::ordered_json::sax_parse(text, &finder)) ThrowValueError("not valid JSON");
  if (!finder.overflowing.empty()) {
    ThrowUnsupported("integer " + finder.overflowing + " does not fit in 64 bits");
  }
  return FromJson(nlohmann::ordered_json::parse(text));
}

Value FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::None();
    case nlohmann::ordered_json::value_t::boolean: return Value::Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t value = json.get<uint64_t>();
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        ThrowUnsupported("integer " + std::to_string(value) + " does not fit in 64 bits");
      }
      return Value::Int(static_cast<int64_t>(value));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& element : json) items.push_back(FromJson(element));
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      for (const auto& [key, element] : json.items()) dict.Set(Value::String(key), FromJson(element));
      return Value::MakeDict(std::move(dict));
    }
    default: ThrowUnsupported("JSON value of type " + std::string(json.type_name()));
  }
}

std::string JsonDumps(const Value& value, const JsonDumpOptions& options) {
  std::string out;
  Encoder(options).Encode(value, 0, &out);
  return out;
}

}  // namespace kappa::tasks::jinja
