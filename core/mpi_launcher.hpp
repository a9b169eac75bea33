#pragma once
// What an MPI launcher (Open MPI's mpirun, MPICH / Hydra, PMIx) tells the
// processes it starts through their environment. Read by the console logger
// (no redrawn status line under a launcher) and by dist/'s world (MPI is
// initialised only under one), so both agree on what counts as a launch.

namespace hg {

// Whether an MPI launcher started this process.
bool launched_by_mpi();

// The number of ranks the launcher announced; 1 when none (or one).
int launched_ranks();

}  // namespace hg
