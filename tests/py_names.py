"""The package names what libstrata names, by asking it: every status strata.h lists (strata_status_name from 0 up to
its "STRATA_E?") has its value, its exception class (or StrataError under the library's name), and each exception
class names a status the library has; tiers, dtypes and backends read as strata.h spells them, "?" outside."""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

import strata  # noqa: E402
from strata import _names, errors  # noqa: E402

with open(os.path.join(T.SOURCE_DIR, "include", "strata.h")) as f:
    header = f.read()
listed = {name: int(value) for name, value in re.findall(r"X\((STRATA_\w+),\s*(\d+),", header)}
T.check(len(listed) > 10, "strata.h's STRATA_STATUS_LIST is found", len(listed), "> 10")
T.check(_names.status_codes() == listed, "the statuses the library enumerates are strata.h's list",
        _names.status_codes(), listed)

classes = [getattr(strata, name) for name in strata.__all__
           if isinstance(getattr(strata, name), type) and issubclass(getattr(strata, name), errors.StrataError)]
for cls in classes:
    T.check(cls.status in listed, "%s names a status of the library" % cls.__name__, cls.status, sorted(listed))
    if cls is not errors.LibraryNotFound:
        T.check(cls("x").code == listed[cls.status], "%s(...).code" % cls.__name__, cls("x").code, listed[cls.status])

for name, code in listed.items():
    e = errors.error_for(code, "message")
    T.check(e.status == name and e.code == code and str(e) == "message",
            "error_for(%d) carries the status, its value and the message" % code, (e.status, e.code, str(e)),
            (name, code, "message"))
    own = [cls for cls in classes if cls.status == name and cls is not errors.LibraryNotFound]
    T.check(type(e) is (own[0] if own else errors.StrataError), "error_for(%d) is its class" % code,
            type(e).__name__, own[0].__name__ if own else "StrataError")
past = max(listed.values()) + 1
T.check(errors.error_for(past, "m").code == past, "a status past the list keeps its value",
        errors.error_for(past, "m").code, past)
T.check(isinstance(errors.error_for(listed["STRATA_ENOSPC"], "m"), OSError), "STRATA_ENOSPC is an OSError too")

for ask, names in ((_names.tier_name, ["device", "host", "nvme", "auto"]),
                   (_names.dtype_name, ["fp32", "bf16", "fp16", "none"]),
                   (_names.backend_name, ["auto", "host", "cuda"])):
    got = [ask(i) for i in range(len(names) + 1)]
    T.check(got == names + ["?"], "%s for 0.. is strata.h's list, then \"?\"" % ask.__name__, got, names + ["?"])
T.done()
