/* comm_attach_nccl's back end in a build without NCCL (no CUDA, or nccl.h / libnccl not found). */
#include "comm/comm_internal.h"

strata_status comm_nccl_attach(comm *c, device *dev, void *nccl_comm)
{
    return err_set(STRATA_EUNSUPPORTED, "comm_attach_nccl: strata was built without NCCL (nccl.h and libnccl were "
                                        "not found next to the CUDA toolkit when it was configured)");
}

strata_status comm_nccl_collective(comm *c, comm_req *r, bool reduce_scatter)
{
    return err_set(STRATA_EUNSUPPORTED, "%s: strata was built without NCCL", r->op);
}

void comm_nccl_release(comm *c)
{
}
