/* The public ranks API (include/strata.h "ranks"): handle-less, so detail goes to the thread's last error
 * (strata_last_error(NULL)), which err_set already wrote. */
#include "comm/comm_internal.h"

STRATA_API strata_status strata_comm_create(strata_comm **out)
{
    return comm_create_from_env(out);
}

STRATA_API strata_status strata_comm_create_mpi(const void *mpi_comm, strata_comm **out)
{
    return comm_create_mpi(mpi_comm, out);
}

STRATA_API void strata_comm_destroy(strata_comm *c)
{
    comm_destroy(c);
}

STRATA_API int strata_comm_rank(const strata_comm *c)
{
    return comm_rank(c);
}

STRATA_API int strata_comm_size(const strata_comm *c)
{
    return comm_size(c);
}

STRATA_API int strata_comm_local_rank(const strata_comm *c)
{
    return comm_local_rank(c);
}
