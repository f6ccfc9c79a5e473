// Writing a pipeline back into the text it was read from, changing only what changed. People keep
// pipeline files in git with comments and one line per stage; an app that rewrites the whole file
// on every save makes their diffs unreadable and throws their comments away.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <functional>
#include <optional>

#include "sluice/core/spec.hpp"

namespace sluice {

namespace pb = google::protobuf;

namespace {

using Tree = pb::TextFormat::ParseInfoTree;

std::string trim_right(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  return s;
}

// Non-ASCII text stays readable (a path or a comment-like value in UTF-8), not octal escapes.
pb::TextFormat::Printer make_printer() {
  pb::TextFormat::Printer printer;
  printer.SetUseUtf8StringEscaping(true);
  return printer;
}

std::string single_line(const pb::Message& message) {
  pb::TextFormat::Printer printer = make_printer();
  printer.SetSingleLineMode(true);
  std::string out;
  printer.PrintToString(message, &out);
  return trim_right(out);
}

std::string multi_line(const pb::Message& message, const std::string& indent) {
  pb::TextFormat::Printer printer = make_printer();
  std::string out, printed;
  printer.PrintToString(message, &printed);
  size_t begin = 0;
  while (begin < printed.size()) {
    size_t end = printed.find('\n', begin);
    if (end == std::string::npos) end = printed.size();
    out += indent + printed.substr(begin, end - begin) + "\n";
    begin = end + 1;
  }
  return out;
}

std::string value_text(const pb::Message& holder, const pb::FieldDescriptor* field, int index) {
  pb::TextFormat::Printer printer = make_printer();
  std::string value;
  printer.PrintFieldValueToString(holder, field, index, &value);
  return value;
}

// `name: value` or `name { ... }` for one value of a field, on one line or indented over several.
std::string field_text(const pb::Message& holder, const pb::FieldDescriptor* field, int index, bool multiline,
                       const std::string& indent) {
  const auto* reflection = holder.GetReflection();
  if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE)
    return field->name() + ": " + value_text(holder, field, field->is_repeated() ? index : -1);
  const pb::Message& value =
      field->is_repeated() ? reflection->GetRepeatedMessage(holder, field, index) : reflection->GetMessage(holder, field);
  if (multiline) return field->name() + " {\n" + multi_line(value, indent + "  ") + indent + "}";
  std::string body = single_line(value);
  return field->name() + (body.empty() ? " {}" : " { " + body + " }");
}

struct Span {
  size_t begin = 0, end = 0;
};

class TextPatcher {
 public:
  explicit TextPatcher(const std::string& text) : text_(text), newline_(text.find("\r\n") != std::string::npos ? "\r\n" : "\n") {
    line_starts_.push_back(0);
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\n') line_starts_.push_back(i + 1);
  }

  // The whole text as the body of the top-level message.
  void patch(const pb::Message& before, const pb::Message& after, const Tree& tree) {
    patch_message(before, after, tree, Span{0, text_.size()}, true);
  }

  std::string result() {
    // Applied from the end; where an insertion and a removal start at one place, the removal goes
    // first so that it cannot take the inserted text with it.
    auto order = [](const Edit& e) { return std::make_pair(e.begin, e.begin == e.end ? 0 : 1); };
    std::stable_sort(edits_.begin(), edits_.end(), [&](const Edit& a, const Edit& b) { return order(a) < order(b); });
    std::string out = text_;
    for (auto it = edits_.rbegin(); it != edits_.rend(); ++it) out.replace(it->begin, it->end - it->begin, it->text);
    return out;
  }

 private:
  struct Edit {
    size_t begin, end;
    std::string text;
  };

  // The tokenizer counts a tab as reaching the next multiple of 8 columns.
  size_t offset(const pb::TextFormat::ParseLocation& location) const {
    size_t pos = line_starts_.at(static_cast<size_t>(location.line));
    for (int column = 0; column < location.column && pos < text_.size() && text_[pos] != '\n'; ++pos)
      column += text_[pos] == '\t' ? 8 - column % 8 : 1;
    return pos;
  }

  bool located(const Tree& tree, const pb::FieldDescriptor* field, int index) const {
    return tree.GetLocationRange(field, field->is_repeated() ? index : -1).start.line >= 0;
  }
  Span span_of(const Tree& tree, const pb::FieldDescriptor* field, int index) const {
    auto range = tree.GetLocationRange(field, field->is_repeated() ? index : -1);
    return {offset(range.start), offset(range.end)};
  }

  size_t line_begin(size_t pos) const {
    while (pos > 0 && text_[pos - 1] != '\n') --pos;
    return pos;
  }
  // Where the line's break starts (its '\r' in a file with Windows line ends).
  size_t line_end(size_t pos) const {
    size_t end = text_.find('\n', pos);
    if (end == std::string::npos) return text_.size();
    return end > pos && text_[end - 1] == '\r' ? end - 1 : end;
  }
  std::string indent_at(size_t pos) const {
    size_t begin = line_begin(pos), end = begin;
    while (end < text_.size() && (text_[end] == ' ' || text_[end] == '\t')) ++end;
    return text_.substr(begin, end - begin);
  }
  // Nothing but blanks and perhaps a comment between `pos` and the end of its line.
  bool rest_of_line_is_empty(size_t pos) const {
    while (pos < text_.size() && (text_[pos] == ' ' || text_[pos] == '\t' || text_[pos] == '\r')) ++pos;
    return pos >= text_.size() || text_[pos] == '\n' || text_[pos] == '#';
  }
  bool start_of_line_is_empty(size_t pos) const {
    for (size_t i = line_begin(pos); i < pos; ++i)
      if (text_[i] != ' ' && text_[i] != '\t') return false;
    return true;
  }

  void replace(size_t begin, size_t end, std::string text) { edits_.push_back({begin, end, std::move(text)}); }
  // Printed text breaks lines with '\n'; the file's own line break is used instead.
  std::string with_newlines(const std::string& printed) const {
    if (newline_ == "\n") return printed;
    std::string out;
    for (char c : printed) out += c == '\n' ? newline_ : std::string(1, c);
    return out;
  }

  void remove(Span span) {
    if (start_of_line_is_empty(span.begin) && rest_of_line_is_empty(span.end)) {
      size_t end = text_.find('\n', span.end);
      replace(line_begin(span.begin), end == std::string::npos ? text_.size() : end + 1, "");
      return;
    }
    size_t end = span.end;
    bool blank_before = span.begin > 0 && (text_[span.begin - 1] == ' ' || text_[span.begin - 1] == '\t');
    if (blank_before)
      while (end < text_.size() && (text_[end] == ' ' || text_[end] == '\t')) ++end;
    replace(span.begin, end, "");
  }

  // Replaces the value of `name: value` in `span`, keeping the name, spacing and separator.
  void replace_value(Span span, const pb::FieldDescriptor* field, const std::string& value) {
    size_t begin = span.begin + field->name().size();
    while (begin < span.end && (text_[begin] == ' ' || text_[begin] == '\t')) ++begin;
    if (begin < span.end && text_[begin] == ':') ++begin;
    while (begin < span.end && (text_[begin] == ' ' || text_[begin] == '\t')) ++begin;
    size_t end = span.end;
    if (end > begin && (text_[end - 1] == ';' || text_[end - 1] == ',')) --end;
    while (end > begin && (text_[end - 1] == ' ' || text_[end - 1] == '\t')) --end;
    replace(begin, end, value);
  }

  // The inside of `name { ... }` (or `< ... >`): after the opening bracket, at the closing one.
  Span body_of(Span span) const {
    size_t open = text_.find_first_of("{<", span.begin);
    size_t close = span.end;
    while (close > open && text_[close - 1] != '}' && text_[close - 1] != '>') --close;
    return {open + 1, close > open ? close - 1 : open + 1};
  }

  // Every located value at this level, in the text's order.
  std::vector<std::pair<const pb::FieldDescriptor*, Span>> located_fields(const pb::Descriptor* type, const Tree& tree,
                                                                         const pb::Message& before) const {
    std::vector<std::pair<const pb::FieldDescriptor*, Span>> all;
    const auto* reflection = before.GetReflection();
    for (int i = 0; i < type->field_count(); ++i) {
      const auto* field = type->field(i);
      int count = field->is_repeated() ? reflection->FieldSize(before, field) : 1;
      for (int k = 0; k < count; ++k)
        if (located(tree, field, k)) all.emplace_back(field, span_of(tree, field, k));
    }
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.second.begin < b.second.begin; });
    return all;
  }

  // Adds `text` for a field missing from the body: after the last value of a field numbered up
  // to its own, else before the first value, on that value's line or on a line of its own as the
  // text around it is written.
  void insert(const pb::Message& before, const Tree& tree, Span body, bool top_level, const pb::FieldDescriptor* field,
              const std::function<std::string(bool multiline, const std::string& indent)>& text_for,
              std::optional<Span> after = std::nullopt) {
    auto present = located_fields(before.GetDescriptor(), tree, before);
    if (!after) {
      for (const auto& [other, span] : present)
        if (other->number() <= field->number() && (!after || span.end > after->end)) after = span;
    }
    if (after) {
      bool own_lines = start_of_line_is_empty(after->begin) && rest_of_line_is_empty(after->end);
      bool multiline = text_.find('\n', after->begin) < after->end;
      if (own_lines) {
        std::string indent = indent_at(after->begin);
        replace(line_end(after->end), line_end(after->end), newline_ + indent + with_newlines(text_for(multiline, indent)));
      } else {
        replace(after->end, after->end, " " + text_for(false, ""));
      }
      return;
    }
    if (!present.empty()) {
      Span first = present.front().second;
      if (start_of_line_is_empty(first.begin)) {
        std::string indent = indent_at(first.begin);
        replace(line_begin(first.begin), line_begin(first.begin), indent + text_for(false, indent) + newline_);
      } else {
        replace(first.begin, first.begin, text_for(false, "") + " ");
      }
      return;
    }
    if (top_level) {
      std::string lead = text_.empty() || text_.back() == '\n' ? "" : newline_;
      replace(text_.size(), text_.size(), lead + text_for(false, "") + newline_);
      return;
    }
    replace(body.begin, body.end, " " + text_for(false, "") + " ");
  }

  static std::string key_of(const pb::Message& element) {
    const auto* type = element.GetDescriptor();
    const auto* key = type->map_key() ? type->map_key() : type->FindFieldByName("id");
    if (!key || key->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING) return {};
    return element.GetReflection()->GetString(element, key);
  }

  void patch_repeated_messages(const pb::Message& before, const pb::Message& after, const Tree& tree, Span body,
                               bool top_level, const pb::FieldDescriptor* field) {
    const auto* reflection = before.GetReflection();
    const int old_count = reflection->FieldSize(before, field), new_count = reflection->FieldSize(after, field);
    // Pair the values by key (a stage's id, a map's key); those left over pair in order, so a
    // renamed stage is edited where it stands.
    std::vector<int> partner(static_cast<size_t>(new_count), -1);
    std::vector<bool> taken(static_cast<size_t>(old_count), false);
    for (int n = 0; n < new_count; ++n) {
      const std::string key = key_of(reflection->GetRepeatedMessage(after, field, n));
      if (key.empty()) continue;
      for (int o = 0; o < old_count; ++o)
        if (!taken[static_cast<size_t>(o)] && key_of(reflection->GetRepeatedMessage(before, field, o)) == key) {
          partner[static_cast<size_t>(n)] = o;
          taken[static_cast<size_t>(o)] = true;
          break;
        }
    }
    int next_old = 0;
    for (int n = 0; n < new_count; ++n) {
      if (partner[static_cast<size_t>(n)] >= 0) continue;
      while (next_old < old_count && taken[static_cast<size_t>(next_old)]) ++next_old;
      if (next_old == old_count) break;
      partner[static_cast<size_t>(n)] = next_old;
      taken[static_cast<size_t>(next_old)] = true;
    }
    for (int o = 0; o < old_count; ++o)
      if (!taken[static_cast<size_t>(o)] && located(tree, field, o)) remove(span_of(tree, field, o));
    std::optional<Span> previous;
    for (int n = 0; n < new_count; ++n) {
      const int o = partner[static_cast<size_t>(n)];
      if (o >= 0 && located(tree, field, o)) {
        const auto* nested = tree.GetTreeForNested(field, o);
        Span span = span_of(tree, field, o);
        if (nested)
          patch_message(reflection->GetRepeatedMessage(before, field, o), reflection->GetRepeatedMessage(after, field, n),
                        *nested, body_of(span), false);
        previous = span;
        continue;
      }
      auto text_for = [&, n](bool multiline, const std::string& indent) { return field_text(after, field, n, multiline, indent); };
      if (previous) {
        insert(before, tree, body, top_level, field, text_for, previous);
      } else {
        // Before the first value of the field when it has one, else where a new field goes.
        std::optional<Span> first;
        for (int k = 0; k < old_count; ++k)
          if (located(tree, field, k) && (!first || span_of(tree, field, k).begin < first->begin)) first = span_of(tree, field, k);
        if (first && start_of_line_is_empty(first->begin)) {
          std::string indent = indent_at(first->begin);
          bool multiline = text_.find('\n', first->begin) < first->end;
          replace(line_begin(first->begin), line_begin(first->begin), indent + with_newlines(text_for(multiline, indent)) + newline_);
        } else if (first) {
          replace(first->begin, first->begin, text_for(false, "") + " ");
        } else {
          insert(before, tree, body, top_level, field, text_for);
        }
      }
    }
  }

  void patch_repeated_scalars(const pb::Message& before, const pb::Message& after, const Tree& tree, Span body,
                              bool top_level, const pb::FieldDescriptor* field) {
    const auto* reflection = before.GetReflection();
    const int old_count = reflection->FieldSize(before, field), new_count = reflection->FieldSize(after, field);
    std::optional<Span> last;
    for (int k = 0; k < std::max(old_count, new_count); ++k) {
      bool in_text = k < old_count && located(tree, field, k);
      if (in_text) last = span_of(tree, field, k);
      if (k >= new_count) {
        if (in_text) remove(span_of(tree, field, k));
      } else if (k >= old_count || !in_text) {
        auto text_for = [&, k](bool, const std::string&) { return field_text(after, field, k, false, ""); };
        insert(before, tree, body, top_level, field, text_for, last);
      } else if (value_text(before, field, k) != value_text(after, field, k)) {
        replace_value(span_of(tree, field, k), field, value_text(after, field, k));
      }
    }
  }

  void patch_message(const pb::Message& before, const pb::Message& after, const Tree& tree, Span body, bool top_level) {
    if (pb::util::MessageDifferencer::Equals(before, after)) return;
    const auto* type = before.GetDescriptor();
    const auto* reflection = before.GetReflection();
    for (int i = 0; i < type->field_count(); ++i) {
      const auto* field = type->field(i);
      const bool is_message = field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
      if (field->is_repeated()) {
        if (is_message)
          patch_repeated_messages(before, after, tree, body, top_level, field);
        else
          patch_repeated_scalars(before, after, tree, body, top_level, field);
        continue;
      }
      const bool in_text = located(tree, field, -1);
      const bool wanted = reflection->HasField(after, field);
      auto text_for = [&](bool multiline, const std::string& indent) { return field_text(after, field, -1, multiline, indent); };
      if (is_message) {
        if (in_text && wanted) {
          const auto* nested = tree.GetTreeForNested(field, -1);
          if (nested)
            patch_message(reflection->GetMessage(before, field), reflection->GetMessage(after, field), *nested,
                          body_of(span_of(tree, field, -1)), false);
        } else if (in_text) {
          remove(span_of(tree, field, -1));
        } else if (wanted) {
          insert(before, tree, body, top_level, field, text_for);
        }
        continue;
      }
      if (value_text(before, field, -1) == value_text(after, field, -1) && reflection->HasField(before, field) == wanted)
        continue;
      if (in_text && wanted)
        replace_value(span_of(tree, field, -1), field, value_text(after, field, -1));
      else if (in_text)
        remove(span_of(tree, field, -1));
      else if (wanted)
        insert(before, tree, body, top_level, field, text_for);
    }
  }

  const std::string& text_;
  const std::string newline_;
  std::vector<size_t> line_starts_;
  std::vector<Edit> edits_;
};

class Silent final : public pb::io::ErrorCollector {
  void AddError(int, pb::io::ColumnNumber, const std::string&) override {}
};

bool is_json(const std::string& text) {
  auto first = text.find_first_not_of(" \t\r\n");
  return first != std::string::npos && text[first] == '{';
}

}  // namespace

std::string pipeline_to_text(const spec::PipelineSpec& spec) {
  // One line for the options and one per stage: a file people read, comment and diff.
  std::string out;
  const auto* type = spec.GetDescriptor();
  const auto* reflection = spec.GetReflection();
  for (int i = 0; i < type->field_count(); ++i) {
    const auto* field = type->field(i);
    int count = field->is_repeated() ? reflection->FieldSize(spec, field) : reflection->HasField(spec, field) ? 1 : 0;
    for (int k = 0; k < count; ++k) out += field_text(spec, field, field->is_repeated() ? k : -1, false, "") + "\n";
  }
  return out;
}

std::string update_pipeline_text(const std::string& original, const spec::PipelineSpec& updated) {
  if (is_json(original)) {
    std::string json;
    pb::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.preserve_proto_field_names = true;
    if (pb::util::MessageToJsonString(updated, &json, options).ok()) return json;
    return pipeline_to_text(updated);
  }
  spec::PipelineSpec before;
  Tree tree;
  Silent silent;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&silent);
  parser.WriteLocationsTo(&tree);
  if (original.empty() || !parser.ParseFromString(original, &before)) return pipeline_to_text(updated);
  std::string patched;
  try {
    TextPatcher patcher(original);
    patcher.patch(before, updated, tree);
    patched = patcher.result();
  } catch (const std::exception&) {
    return pipeline_to_text(updated);  // a location the patcher misread: the text is written whole
  }
  // The edit must read back as exactly what is being saved; a text the patcher cannot account
  // for (an unusual layout of the original) is written whole instead.
  spec::PipelineSpec check;
  pb::TextFormat::Parser verify;
  verify.RecordErrorsTo(&silent);
  if (verify.ParseFromString(patched, &check) && pb::util::MessageDifferencer::Equals(check, updated)) return patched;
  return pipeline_to_text(updated);
}

}  // namespace sluice
