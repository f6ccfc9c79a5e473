#pragma once
#include <stdexcept>
#include <string>

namespace sluice {

/// Every failure that crosses the plugin boundary derives from Error; the engine catches it at
/// that boundary and turns it into a stage error naming the stage and the element's origin.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A parameter value that does not fit the operator's schema or its own checks.
class ParamError : public Error {
 public:
  using Error::Error;
};

/// Input data that cannot be used (corrupt record, undecodable image, ragged batch...).
/// Under the skip policy the engine drops the element and counts it.
class DataError : public Error {
 public:
  using Error::Error;
};

/// (6.5) An element that does not fit the operator's parameters rather than a damaged one (a
/// feature the spec names that the record lacks, values of another type). When no element has
/// passed the stage yet, the engine says the parameters are likely wrong instead of advising the
/// skip policy, which would then drop every element. Skipped like any DataError.
class SchemaMismatch : public DataError {
 public:
  using DataError::DataError;
};

}  // namespace sluice
