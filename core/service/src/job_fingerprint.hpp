#pragma once
// What identifies a job's work (its pipeline, where its relative paths start, its mode), for a worker to check that the job it knows by an id is the one a
// trainer asks for (a dispatcher restarted without a journal numbers its jobs afresh).
#include <cstdint>
#include <filesystem>
#include <string>

#include "service.pb.h"

namespace sluice::service::detail {

// The folder the job's relative paths start from (the trainers sharing a job may run files of other
// names there: their stages after the service differ).
inline std::string pipeline_folder(const proto::JobRequest& job) {
  return std::filesystem::path(job.pipeline_file()).parent_path().string();
}

inline std::uint64_t job_fingerprint(const proto::JobRequest& job) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
  auto mix = [&](const std::string& bytes) {
    for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
    hash = (hash ^ 0xff) * 1099511628211ull;
  };
  mix(job.pipeline());
  mix(pipeline_folder(job));
  mix(std::to_string(static_cast<int>(job.mode())));
  mix(std::to_string(job.split_size()));
  mix(std::to_string(static_cast<int>(job.compression())));
  mix(std::to_string(job.num_consumers()));
  return hash;
}

}  // namespace sluice::service::detail
