#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/tensor.hpp"

namespace sluice {

struct Field {
  std::string name;
  Tensor tensor;
};

/// Where an element came from, for error messages and skip reports: a description shared by all
/// the elements of one input (a file name), and for records inside it their index and byte
/// offset. Kept as numbers and formatted only when a message needs it: a reader handing out
/// hundreds of thousands of records a second allocates nothing for their origins.
struct Origin {
  std::shared_ptr<const std::string> where;
  std::int64_t record = -1;       ///< -1: not a record inside `where`
  std::int64_t byte_offset = -1;  ///< -1: unknown
  /// (6.0) Set by the host on what an interleave (expand stage) hands on: the iteration and the
  /// position there of the element, so that a checkpoint can name an element a later stage holds
  /// (by its input, record and byte offset) rather than keep its bytes. -1: not set.
  std::uint64_t read_epoch = 0;
  std::int64_t read_index = -1;

  bool empty() const { return !where || where->empty(); }
  /// "WHERE", or "WHERE record N (byte offset B)".
  std::string text() const {
    std::string out = where ? *where : std::string();
    if (record >= 0) {
      out += " record " + std::to_string(record);
      if (byte_offset >= 0) out += " (byte offset " + std::to_string(byte_offset) + ")";
    }
    return out;
  }
};

/// One element flowing through a pipeline: a small ordered set of named tensors, plus where it
/// came from (file, record index, byte offset) so that errors and skip reports can name it.
/// A batch is a Sample whose tensors carry a leading batch dimension.
class Sample {
 public:
  Tensor& set(std::string name, Tensor tensor) {
    for (auto& f : fields_)
      if (f.name == name) return f.tensor = std::move(tensor);
    fields_.push_back({std::move(name), std::move(tensor)});
    return fields_.back().tensor;
  }
  const Tensor* find(std::string_view name) const {
    for (const auto& f : fields_)
      if (f.name == name) return &f.tensor;
    return nullptr;
  }
  Tensor* find(std::string_view name) {
    for (auto& f : fields_)
      if (f.name == name) return &f.tensor;
    return nullptr;
  }
  const Tensor& at(std::string_view name) const {
    if (const Tensor* t = find(name)) return *t;
    std::string have;
    for (const auto& f : fields_) have += (have.empty() ? "" : ", ") + f.name;
    throw DataError("element has no field '" + std::string(name) + "' (fields: " + (have.empty() ? "none" : have) + ")");
  }
  bool erase(std::string_view name) {
    for (auto it = fields_.begin(); it != fields_.end(); ++it)
      if (it->name == name) {
        fields_.erase(it);
        return true;
      }
    return false;
  }

  /// Room for n fields without reallocating (sources that know their fields call it first).
  void reserve(std::size_t n) { fields_.reserve(n); }

  std::vector<Field>& fields() { return fields_; }
  const std::vector<Field>& fields() const { return fields_; }
  std::size_t size() const { return fields_.size(); }
  bool empty() const { return fields_.empty(); }

  std::size_t nbytes() const {
    std::size_t n = 0;
    for (const auto& f : fields_) n += f.tensor.nbytes();
    return n;
  }

  /// Where the element came from ("FILE record N (byte offset B)"), for error messages. It is
  /// shared, not copied, as the element moves from stage to stage: pass it on with share_origin().
  std::string origin() const { return origin_.text(); }
  bool has_origin() const { return !origin_.empty(); }
  void set_origin(std::string origin) {
    origin_ = Origin{std::make_shared<const std::string>(std::move(origin)), -1, -1};
  }
  /// A record inside a shared description: the reader makes `where` once per file.
  void set_origin(std::shared_ptr<const std::string> where, std::int64_t record, std::int64_t byte_offset) {
    origin_ = Origin{std::move(where), record, byte_offset};
  }
  void share_origin(const Sample& from) { origin_ = from.origin_; }
  void set_read_position(std::uint64_t epoch, std::int64_t index) {
    origin_.read_epoch = epoch;
    origin_.read_index = index;
  }
  const Origin& shared_origin() const { return origin_; }

 private:
  std::vector<Field> fields_;
  Origin origin_;
};

}  // namespace sluice
