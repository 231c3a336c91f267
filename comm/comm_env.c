/* Whether a launcher started this process: the variables Open MPI, PMIx and PMI(2) launchers set. */
#include <stdlib.h>

#include "comm/comm_internal.h"

bool comm_launched_by_mpirun(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}
