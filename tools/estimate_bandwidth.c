#include "tools/estimate_bandwidth.h"

void estimate_bandwidth_analyze(double flops, double flops_per_s, const double bytes[BW_NLINKS], const double gbps[BW_NLINKS],
                bw_analysis *a)
{
    static const char *names[BW_NLINKS] = {"link (collectives)", "nvme", "pcie (host<->device)"};
    *a = (bw_analysis){.flops = flops, .compute_s = flops / flops_per_s};
    a->lower_bound_s = a->no_overlap_s = a->compute_s;
    for (int i = 0; i < BW_NLINKS; i++) {
        bw_link *l = &a->links[i];
        *l = (bw_link){.name = names[i], .bytes = bytes[i], .bytes_per_s = gbps[i] * 1e9 / 8};
        if (l->bytes_per_s <= 0)
            continue;
        l->time_s = l->bytes / l->bytes_per_s;
        l->ait_flop_per_byte = l->bytes > 0 ? flops / l->bytes : 0;
        /* The paper's form: with ait = flops/bytes and peak = flops_per_s, ait·bw / (ait·bw + peak) equals
         * compute_s / (compute_s + time_s), the no-overlap efficiency with this link alone; so it agrees with
         * efficiency_no_overlap below whenever this is the only link that moves bytes. */
        l->efficiency_alone = l->bytes > 0 ? l->ait_flop_per_byte * l->bytes_per_s /
                                                 (l->ait_flop_per_byte * l->bytes_per_s + flops_per_s)
                                           : 1;
        a->lower_bound_s = l->time_s > a->lower_bound_s ? l->time_s : a->lower_bound_s;
        a->no_overlap_s += l->time_s;
    }
    a->efficiency = a->compute_s / a->lower_bound_s;
    a->efficiency_no_overlap = a->compute_s / a->no_overlap_s;
}
