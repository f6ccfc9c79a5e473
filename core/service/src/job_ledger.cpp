#include "job_ledger.hpp"

#include <algorithm>
#include <limits>

#include "service.pb.h"

namespace sluice::service {

JobLedger::JobLedger(std::vector<std::uint64_t> preferred) : end_(preferred.size()), preferred_(std::move(preferred)) {}

std::map<std::uint64_t, std::size_t> JobLedger::load() const {
  std::map<std::uint64_t, std::size_t> out;
  for (const auto& [split, given] : in_hand_) ++out[given.worker];
  return out;
}

JobLedger::Next JobLedger::next_split(const std::vector<std::uint64_t>& able, Given& out, const std::string& reader) {
  if (finished()) return Next::End;
  std::optional<std::uint64_t> split, skip;
  if (!given_back_.empty()) {
    split = given_back_.begin()->first;
    skip = given_back_.begin()->second;
  } else if (!end_ || next_new_ < *end_) {
    split = next_new_;
    skip = 0;
  }
  if (!split || able.empty()) return Next::Wait;
  const std::uint64_t worker = choose_worker(*split, able);
  if (!given_back_.empty() && given_back_.begin()->first == *split) given_back_.erase(given_back_.begin());
  else ++next_new_;
  out = {*split, *skip, worker, next_lease_++, reader};
  in_hand_[*split] = out;
  return Next::Split;
}

std::uint64_t JobLedger::choose_worker(std::uint64_t split, const std::vector<std::uint64_t>& able) {
  if (fixed() && std::find(able.begin(), able.end(), preferred_[split]) != able.end()) return preferred_[split];
  // Fast workers finish theirs sooner and so are asked again sooner: they do more. Among equally
  // loaded ones, each in turn (a trainer reading one split at a time still spreads them over every
  // worker).
  std::uint64_t worker = able.front();
  const auto loads = load();
  std::size_t least = std::numeric_limits<std::size_t>::max();
  for (std::size_t k = 0; k < able.size(); ++k) {
    const std::uint64_t w = able[(turn_ + k) % able.size()];
    const auto it = loads.find(w);
    const std::size_t l = it == loads.end() ? 0 : it->second;
    if (l < least) {
      least = l;
      worker = w;
    }
  }
  ++turn_;
  return worker;
}

JobLedger::Next JobLedger::hand_again(std::uint64_t split, std::uint64_t lease, std::uint64_t skip, const std::vector<std::uint64_t>& able,
                                      Given& out) {
  if (!holds(split, lease)) return Next::End;
  if (able.empty()) return Next::Wait;
  Given& given = in_hand_.at(split);
  given.skip = std::max(given.skip, skip);
  given.worker = std::numeric_limits<std::uint64_t>::max();  // not counted in its old worker's load while choosing
  given.worker = choose_worker(split, able);
  given.lease = next_lease_++;
  out = given;
  return Next::Split;
}

std::size_t JobLedger::done_count() const {
  const std::uint64_t handed = end_ ? std::min(next_new_, *end_) : next_new_;
  return static_cast<std::size_t>(handed) - in_hand_.size() - given_back_.size();
}

bool JobLedger::holds(std::uint64_t split, std::uint64_t lease) const { return holding(split, lease) != nullptr; }

const JobLedger::Given* JobLedger::holding(std::uint64_t split, std::uint64_t lease) const {
  const auto it = in_hand_.find(split);
  return it != in_hand_.end() && it->second.lease == lease ? &it->second : nullptr;
}

bool JobLedger::done(std::uint64_t split, std::uint64_t lease) {
  if (!holds(split, lease)) return false;
  in_hand_.erase(split);
  return true;
}

bool JobLedger::give_back(std::uint64_t split, std::uint64_t lease, std::uint64_t received) {
  if (!holds(split, lease)) return false;
  const std::uint64_t skip = in_hand_.at(split).skip;
  in_hand_.erase(split);
  given_back_[split] = std::max(skip, received);
  return true;
}

bool JobLedger::ended_at(std::uint64_t split, std::uint64_t lease) {
  if (fixed() || !holds(split, lease)) return false;
  end_ = end_ ? std::min(*end_, split) : split;
  // Splits past the end have nothing: none is made again.
  for (auto it = given_back_.begin(); it != given_back_.end();) it = it->first >= *end_ ? given_back_.erase(it) : std::next(it);
  for (auto it = in_hand_.begin(); it != in_hand_.end();) it = it->first >= *end_ ? in_hand_.erase(it) : std::next(it);
  return true;
}

void JobLedger::save(proto::LedgerState& out) const {
  out.Clear();
  out.set_next_new(next_new_);
  out.set_next_lease(next_lease_);
  out.set_turn(turn_);
  if (end_) out.set_end(*end_);
  for (const auto& [split, given] : in_hand_) {
    auto* s = out.add_in_hand();
    s->set_split(split);
    s->set_skip(given.skip);
    s->set_worker(given.worker);
    s->set_lease(given.lease);
    s->set_reader(given.reader);
  }
  for (const auto& [split, skip] : given_back_) {
    auto* s = out.add_given_back();
    s->set_split(split);
    s->set_skip(skip);
  }
  for (const auto worker : preferred_) out.add_preferred(worker);
  out.set_fixed(fixed());
}

JobLedger JobLedger::restore(const proto::LedgerState& state) {
  JobLedger ledger(std::vector<std::uint64_t>(state.preferred().begin(), state.preferred().end()));
  ledger.next_new_ = state.next_new();
  ledger.next_lease_ = std::max<std::uint64_t>(state.next_lease(), 1);
  ledger.turn_ = static_cast<std::size_t>(state.turn());
  ledger.end_ = state.has_end() ? std::optional<std::uint64_t>(state.end()) : std::nullopt;
  for (const auto& s : state.in_hand()) ledger.in_hand_[s.split()] = {s.split(), s.skip(), s.worker(), s.lease(), s.reader()};
  for (const auto& s : state.given_back()) ledger.given_back_[s.split()] = s.skip();
  return ledger;
}

}  // namespace sluice::service
