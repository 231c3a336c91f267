#!/usr/bin/env bash
# Runs its arguments with the python of the venv that holds today's torch and Hugging Face releases (the <name>@current
# tests of cmake/python_tests.cmake): STRATA_CURRENT_VENV, which tools/run test makes. Exits 77 (skipped), saying
# how to get it, when that venv is not there, so that a build configured before the venv existed still finds it.
venv=${STRATA_CURRENT_VENV:?STRATA_CURRENT_VENV is not set}
if [ ! -x "$venv/bin/python" ]; then
    echo "SKIP: no $venv/bin/python: tools/run test makes that venv (torch, transformers, accelerate, peft from PyPI)"
    exit 77
fi
exec "$venv/bin/python" "$@"
