#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sluice/error.hpp"

namespace sluice {

// Which of the job's processes this one is. Decided in one place (detect_worker_identity), from
// the command line, the pipeline file's options or the variables the launcher set.
struct WorkerIdentity {
  int index = 0;
  int count = 1;
  // Who said so: "single process", "--worker-index/--num-workers", "Slurm", "Open MPI", "PMI",
  // "PMIx", "TF_CONFIG", "torchrun", "Horovod", "Kubernetes indexed job", ...
  std::string source = "single process";
  // The variables read, as "SLURM_PROCID=2, SLURM_NTASKS=3"; empty for a single process.
  std::string variables;

  // "Slurm: SLURM_PROCID=2, SLURM_NTASKS=3", or the source alone when no variable was read.
  std::string origin() const;
  // "worker 2 of 3 (Slurm: SLURM_PROCID=2, SLURM_NTASKS=3)"
  std::string describe() const;
};

// A launcher's variables that cannot be used: malformed, incomplete or contradicting another's.
// The message names each variable involved and what to do.
class WorkerIdentityError : public Error {
 public:
  using Error::Error;
};

// Reads a variable; nullopt when it is not set. Tests pass their own.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;
Environment process_environment();

// What was asked for explicitly: by --worker-index/--num-workers, or by the pipeline file's
// options (`given_by` says which, for messages and the report).
struct WorkerRequest {
  std::optional<int> index;
  std::optional<int> count;
  std::string given_by = "--worker-index/--num-workers";
};

// The identity, in this order: what was asked for explicitly, then Slurm (SLURM_PROCID,
// SLURM_NTASKS), Open MPI (OMPI_COMM_WORLD_RANK/SIZE), PMI (PMI_RANK/PMI_SIZE) and PMIx
// (PMIX_RANK), TF_CONFIG, torchrun (RANK, WORLD_SIZE), Horovod (HOROVOD_RANK/SIZE), a Kubernetes
// indexed job (JOB_COMPLETION_INDEX, with the count asked for). Every other launcher whose
// variables are present must agree with the one that decides, with one exception: Open MPI,
// torchrun and Horovod started inside a Slurm allocation (mpirun in an sbatch script) give their
// processes the Slurm variables of their own job step, so there they decide and Slurm's are
// ignored. A count alone asked for explicitly takes the index from the environment. Throws
// WorkerIdentityError naming the variables when they are malformed, incomplete or contradictory.
WorkerIdentity detect_worker_identity(const Environment& env, const WorkerRequest& request = {});

// `text` with {worker} and {num_workers} replaced; other braces are left as they are.
std::string substitute_worker_fields(const std::string& text, const WorkerIdentity& worker);

// A seed for worker `index` derived from the pipeline's, for runs whose workers each read the
// whole dataset ("copy the dataset"): each sees its own shuffles and augmentations.
std::uint64_t worker_seed(std::uint64_t seed, int index);

}  // namespace sluice
