/*
 * strata_last_error for the emulated tests. testlib's T_OK prints strata_last_error(NULL), the calling thread's last
 * error. libstrata defines it in engine/engine.c, and linking that object would pull in the engine and with it the
 * library's CUDA backend and the real CUDA runtime, whose symbols the emulator defines (emu_runtime.cpp). The emulated
 * tests create no engine, so this definition, which the linker takes before the archive's, answers for NULL as the
 * engine's does and says so for anything else.
 */
#include "base/error.h"
#include "strata.h"

const char *strata_last_error(const strata_engine *e)
{
    return e ? "(an engine's last error: the engine is not linked into the emulated tests)" : err_last();
}
