#pragma once
// A pipeline file's syntax error in the file's own words: protobuf's text-format parser says what
// token it met ("Message type \"sluice.spec.Stage\" has no field named \"stage\"", at the line of
// that token); this says what the writer got wrong, and where (a block left open is named at the
// line it opens on).

#include <string>

#include "sluice/core/spec.hpp"

namespace sluice {

// `line` and `column` 1-based, as protobuf reports them plus one; `message` protobuf's.
Problem explain_syntax_error(const std::string& text, const std::string& file, int line, int column, const std::string& message);

}  // namespace sluice
