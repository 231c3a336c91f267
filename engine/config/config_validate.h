/* Checks a whole strata_config: every field's range (for configs filled from C) and the
 * relations between fields that no single key shows. */
#ifndef STRATA_ENGINE_CONFIG_VALIDATE_H
#define STRATA_ENGINE_CONFIG_VALIDATE_H

#include "engine/config/config_report.h"
#include "strata.h"

/* Adds every problem of cfg to report. */
void cfg_validate_into(const strata_config *cfg, cfg_report *report);

#endif
