#!/usr/bin/env bash
# Runs programs as a world of N ranks on this machine, the same way for every test.
#   source tests/helpers/mpi.sh; mpi_run NP cmd args...     from a shell test
#   bash tests/helpers/mpi.sh NP cmd args...                what strata_add_mpi_test (CMakeLists.txt) runs
# Exits 77 (skipped) when mpirun is not installed. mpirun's status is the first failing rank's status, so a
# rank's failed check (or skip, 77) is the test's.

mpi_run() {
    local np=$1
    shift
    if ! command -v mpirun >/dev/null; then
        echo "SKIP: mpirun not found (install openmpi-bin)"
        exit 77
    fi
    # Open MPI 4.1 leaks in its plugins and unloads them at MPI_Finalize, so LeakSanitizer (the sanitized suite)
    # reports frames no suppression can name; runs under mpirun leave leak checking off (their plain world-1
    # runs keep it). Address and undefined-behaviour checks stay on.
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    # Tests and CI run as root in containers; Open MPI refuses root without both variables.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # More ranks than cores (4 ranks on 2 cores) must be allowed, also when a hostfile or a
    # resource manager gives fewer slots than --oversubscribe alone would override.
    export OMPI_MCA_rmaps_base_oversubscribe=1
    # --bind-to none: bound ranks would share the few cores they are pinned to while others idle, and
    #   binding fails outright where the container hides the topology.
    # --mca btl self,vader: one host only: shared memory and loopback, no probing of the container's
    #   network interfaces (slow, and noisy when some are down).
    # --mca btl_vader_single_copy_mechanism none: containers often forbid the cross-process memory
    #   copies (CMA, process_vm_readv) vader would use; plain copies through shared memory always work.
    # --mca pml ob1: the BTL path above, never UCX, whose transports vary between machines.
    mpirun -np "$np" --oversubscribe --bind-to none \
        --mca btl self,vader --mca btl_vader_single_copy_mechanism none --mca pml ob1 "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    mpi_run "$@"
fi
