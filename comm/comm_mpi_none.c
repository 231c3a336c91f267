/* The MPI entry points in a build without MPI: every one says so; the launcher check still works, so that a
 * run under mpirun fails loudly instead of running N independent worlds of 1. */
#include <stdlib.h>

#include "comm/comm_internal.h"

static strata_status not_built(const char *op)
{
    return err_set(STRATA_EUNSUPPORTED, "%s: strata was built without MPI (install libopenmpi-dev and reconfigure)",
                   op);
}

strata_status comm_create_mpi(const void *mpi_comm, comm **out)
{
    if (out)
        *out = NULL;
    return not_built("comm_create_mpi");
}

strata_status comm_mpi_create_from_env(comm **out)
{
    *out = NULL;
    return err_set(STRATA_EUNSUPPORTED, "comm_create_from_env: launched by mpirun (the launcher's environment is "
                                        "set), but strata was built without MPI; install libopenmpi-dev and "
                                        "reconfigure, or run without mpirun");
}
