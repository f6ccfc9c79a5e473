#include "job_ledger.hpp"

#include <algorithm>
#include <limits>

namespace sluice::service {

std::map<std::uint64_t, std::size_t> JobLedger::load() const {
  std::map<std::uint64_t, std::size_t> out;
  for (const auto& [split, given] : in_hand_) ++out[given.worker];
  return out;
}

JobLedger::Next JobLedger::next_split(const std::vector<std::uint64_t>& alive, Given& out) {
  if (finished()) return Next::End;
  std::optional<std::uint64_t> split, skip;
  if (!given_back_.empty()) {
    split = given_back_.begin()->first;
    skip = given_back_.begin()->second;
  } else if (!end_ || next_new_ < *end_) {
    split = next_new_;
    skip = 0;
  }
  if (!split || alive.empty()) return Next::Wait;
  // Fast workers finish theirs sooner and so are asked again sooner: they do more.
  // Among equally loaded ones, each in turn (a trainer reading one split at a time still spreads
  // them over every worker).
  const auto loads = load();
  std::uint64_t worker = alive.front();
  std::size_t least = std::numeric_limits<std::size_t>::max();
  for (std::size_t k = 0; k < alive.size(); ++k) {
    const std::uint64_t w = alive[(turn_ + k) % alive.size()];
    const auto it = loads.find(w);
    const std::size_t l = it == loads.end() ? 0 : it->second;
    if (l < least) {
      least = l;
      worker = w;
    }
  }
  ++turn_;
  if (!given_back_.empty() && given_back_.begin()->first == *split) given_back_.erase(given_back_.begin());
  else ++next_new_;
  out = {*split, *skip, worker};
  in_hand_[*split] = out;
  return Next::Split;
}

void JobLedger::done(std::uint64_t split) {
  in_hand_.erase(split);
  given_back_.erase(split);
  done_.insert(split);
}

void JobLedger::give_back(std::uint64_t split, std::uint64_t received) {
  if (done_.count(split)) return;
  in_hand_.erase(split);
  auto& skip = given_back_[split];
  skip = std::max(skip, received);
  if (end_ && split >= *end_) given_back_.erase(split);  // past the end: nothing to make
}

void JobLedger::ended_at(std::uint64_t split) {
  end_ = end_ ? std::min(*end_, split) : split;
  in_hand_.erase(split);
  // Splits past the end have nothing: none is made again.
  for (auto it = given_back_.begin(); it != given_back_.end();) it = it->first >= *end_ ? given_back_.erase(it) : std::next(it);
  for (auto it = in_hand_.begin(); it != in_hand_.end();) it = it->first >= *end_ ? in_hand_.erase(it) : std::next(it);
}

}  // namespace sluice::service
