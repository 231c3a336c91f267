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

STRATA_API strata_status strata_comm_allreduce_sum(strata_comm *c, double *values, size_t n)
{
    if (!c || (!values && n))
        return err_set(STRATA_EINVAL, "strata_comm_allreduce_sum: comm and values must not be NULL");
    return comm_allreduce_uncounted(c, values, n, COMM_F64, COMM_SUM);
}

STRATA_API void strata_comm_abort(strata_comm *c, const char *why)
{
    if (c && comm_size(c) > 1)
        comm_abort_world(c, why && *why ? why : "aborted by the trainer");
}

STRATA_API strata_status strata_comm_set_timeout(strata_comm *c, double seconds)
{
    if (!c)
        return err_set(STRATA_EINVAL, "strata_comm_set_timeout: comm is NULL");
    if (!(seconds >= 0 && seconds <= COMM_TIMEOUT_MAX_S))
        return err_set(STRATA_EINVAL, "strata_comm_set_timeout: seconds = %g is out of range [0, %g] (0 = wait "
                       "forever)", seconds, COMM_TIMEOUT_MAX_S);
    comm_set_timeout(c, (uint32_t)(seconds * 1000.0 + 0.5));
    return STRATA_OK;
}
