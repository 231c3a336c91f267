/* Version and status strings, generated from the one X-macro list in strata.h. */
#include "strata.h"

#define STR_(x) #x
#define XSTR_(x) STR_(x)

STRATA_API const char *strata_version(void)
{
    return XSTR_(STRATA_VERSION_MAJOR) "." XSTR_(STRATA_VERSION_MINOR) "." XSTR_(STRATA_VERSION_PATCH);
}

STRATA_API const char *strata_status_str(strata_status status)
{
    switch (status) {
#define CASE_(name, value, text) case name: return text;
        STRATA_STATUS_LIST(CASE_)
#undef CASE_
    }
    return "unknown status";
}

STRATA_API const char *strata_status_name(strata_status status)
{
    switch (status) {
#define CASE_(name, value, text) case name: return #name;
        STRATA_STATUS_LIST(CASE_)
#undef CASE_
    }
    return "STRATA_E?";
}
