#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "sluice/param_text.hpp"  // format_param, describe_param_constraints

namespace sluice {

// Parses a parameter's text (from a pipeline file or --set) against its spec and checks range and
// choices. Throws ParamError with a message that says what was expected and what was given.
ParamValue parse_param(const ParamSpec& spec, std::string_view text);

// Parses every given value and fills defaults. Throws ParamError naming the first bad parameter;
// use the per-parameter function to collect all problems.
Params parse_params(const std::vector<ParamSpec>& schema, const std::vector<std::pair<std::string, std::string>>& given);

}  // namespace sluice
