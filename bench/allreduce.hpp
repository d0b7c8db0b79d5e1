#pragma once
// The all-reduce benchmark's entry point (bench/allreduce.cpp), for the
// standalone bench_allreduce and for `troupe bench allreduce`.
#include <ostream>
#include <string>
#include <vector>

namespace troupe {

// `troupe bench allreduce` and bench_allreduce (bench/allreduce.cpp):
// [--replicas N] [--sizes 8,64K,1M,16M,64M] [--algorithm ring|tree|reduce_to_one|all]
// [--iterations K] [--op sum|mean|min|max] [--bucket-bytes B] [--chunk-bytes B] [--json]
// [--mpi auto|off|on] (MPI_Allreduce on the same sizes under mpirun, where OpenMPI and
// bench_mpi_allreduce are there); or --algorithm nccl [--devices cuda:0,cuda:1,...]: the
// device collectives' all-reduce, one rank per device (default: every visible GPU; sim:N
// or cpu:N devices time the host emulation, not NCCL). Returns the process exit status
// (2 on bad usage, 1 when it cannot run, e.g. no GPU for --algorithm nccl).
int run_allreduce_bench(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace troupe
