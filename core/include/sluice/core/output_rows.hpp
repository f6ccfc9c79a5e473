#pragma once
// The records an output of a stacking aggregate (batch, padded_batch: StacksItsInputs) holds, row
// by row, carried with the output as its origin is carried: a Python state names the records its
// loop took after the cut, for a job of another number of workers (engine_elastic.cpp).
//
// The origin's `where` stays the first row's (its text, in messages, is unchanged); the rows ride
// in the control block of that pointer, found again with std::get_deleter. Every stage already
// passes origins on, so the rows reach the sink without a field of their own.
#include <vector>

#include "sluice/sample.hpp"

namespace sluice {

// `first`'s origin (where, record, byte offset) carrying `rows`; an origin among `rows` that
// carries rows of its own (a batch of batches) gives those.
Origin origin_with_rows(const Origin& first, const std::vector<Origin>& rows);

// The rows `origin` carries; nullptr for the origin of one record (or of none).
const std::vector<Origin>* rows_carried(const Origin& origin);

}  // namespace sluice
