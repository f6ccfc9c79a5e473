#include "sluice/core/param_parse.hpp"

#include <fmt/format.h>

#include "sluice/core/text.hpp"
#include "sluice/param_text.hpp"

namespace sluice {

// The SDK's reading (sluice/param_text.hpp, which the test harness uses too), with the host's
// suggestion for a mistyped choice.
ParamValue parse_param(const ParamSpec& spec, std::string_view text) {
  try {
    return parse_param_text(spec, text);
  } catch (const ParamError& e) {
    if (spec.type != ParamType::Choice) throw;
    throw ParamError(fmt::format("{}{}", e.what(), did_you_mean(closest_names(std::string(param_text_detail::trim(text)), spec.choices))));
  }
}

Params parse_params(const std::vector<ParamSpec>& schema, const std::vector<std::pair<std::string, std::string>>& given) {
  return parse_param_texts(schema, given, parse_param);
}

}  // namespace sluice
