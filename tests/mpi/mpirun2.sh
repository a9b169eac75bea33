#!/usr/bin/env bash
# Runs a program as 2 MPI ranks on this host: --oversubscribe (CI machines
# may have fewer cores than ranks), --allow-run-as-root as root, and NCCL's
# multicast setting passed on when set.
#   mpirun2.sh PATH/TO/mpirun PROGRAM ARGS...
set -uo pipefail
mpirun=$1
shift
# Open MPI takes an absolute launcher path as --prefix (/bin/mpirun: "/", which
# it refuses): call it by name when PATH finds it.
command -v "$(basename "$mpirun")" >/dev/null && mpirun=$(basename "$mpirun")
launch=("$mpirun" -np 2 --oversubscribe)
[[ $(id -u) -eq 0 ]] && launch+=(--allow-run-as-root)
[[ -n ${NCCL_NVLS_ENABLE:-} ]] && launch+=(-x NCCL_NVLS_ENABLE)
[[ -n ${HG_REQUIRE_CUDA:-} ]] && launch+=(-x HG_REQUIRE_CUDA)
exec "${launch[@]}" "$@"
