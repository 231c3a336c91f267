/* The one place that names dtypes, tiers and backends and sizes dtypes (public: embedders print them too). */
#include "strata.h"

STRATA_API const char *strata_dtype_name(strata_dtype dtype)
{
    switch (dtype) {
    case STRATA_DTYPE_FP32: return "fp32";
    case STRATA_DTYPE_BF16: return "bf16";
    case STRATA_DTYPE_FP16: return "fp16";
    case STRATA_DTYPE_NONE: return "none";
    }
    return "?";
}

STRATA_API size_t strata_dtype_bytes(strata_dtype dtype)
{
    switch (dtype) {
    case STRATA_DTYPE_FP32: return 4;
    case STRATA_DTYPE_BF16:
    case STRATA_DTYPE_FP16: return 2;
    case STRATA_DTYPE_NONE: return 0;
    }
    return 0;
}

STRATA_API const char *strata_tier_name(strata_tier tier)
{
    switch (tier) {
    case STRATA_TIER_DEVICE: return "device";
    case STRATA_TIER_HOST: return "host";
    case STRATA_TIER_NVME: return "nvme";
    case STRATA_TIER_AUTO: return "auto";
    }
    return "?";
}

STRATA_API const char *strata_backend_name(strata_backend_kind backend)
{
    switch (backend) {
    case STRATA_BACKEND_AUTO: return "auto";
    case STRATA_BACKEND_HOST: return "host";
    case STRATA_BACKEND_CUDA: return "cuda";
    }
    return "?";
}
