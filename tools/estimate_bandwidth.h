/* ZeRO-Infinity's bandwidth analysis (§4) for one rank's step: how long compute and each link take, the
 * step-time lower bound, and the efficiency, also in the paper's arithmetic-intensity form. */
#ifndef STRATA_TOOLS_ESTIMATE_BANDWIDTH_H
#define STRATA_TOOLS_ESTIMATE_BANDWIDTH_H

#include <stddef.h>

enum { BW_LINK, BW_NVME, BW_PCIE, BW_NLINKS };

typedef struct bw_link {
    const char *name;
    double bytes, bytes_per_s; /* bytes_per_s 0: the link is not part of the analysis */
    double time_s;
    double ait_flop_per_byte;  /* flops of the step / bytes over this link (0 when no bytes) */
    double efficiency_alone;   /* ait·bw / (ait·bw + peak): compute's share with this link alone, no overlap */
} bw_link;

typedef struct bw_analysis {
    double flops, compute_s;
    bw_link links[BW_NLINKS];
    double lower_bound_s;      /* max(compute, each link): perfect overlap */
    double no_overlap_s;       /* compute + every link */
    double efficiency;         /* compute_s / lower_bound_s */
    double efficiency_no_overlap;
} bw_analysis;

/* flops per step at flops_per_s; bytes and Gbit/s of each link (gbps 0 leaves the link out). */
void estimate_bandwidth_analyze(double flops, double flops_per_s, const double bytes[BW_NLINKS], const double gbps[BW_NLINKS],
                bw_analysis *out);

#endif
