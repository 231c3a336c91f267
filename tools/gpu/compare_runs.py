#!/usr/bin/env python3
"""What tools/gpu/runs.sh reads off `strata train` runs (each run NAME left NAME.jsonl, and NAME.bin from
--dump-weights: the fp32 master weights, raw):

  compare_runs.py --exact A B WHAT            A and B must agree bit for bit: weights and every step's loss
  compare_runs.py --tolerance T A B WHAT      within T: max |wA - wB| <= T x max |wA|, and each loss within T relative
  compare_runs.py --stats FILE.jsonl          medians over the steps after the first: tokens/s, TFLOPS, the split
  compare_runs.py --kernels FILE.csv          Nsight Compute's gpu__time_duration per launch, summed per kernel name
                                              (the figure: each kind's share, and the TF32 products')

Each prints one line starting with "FIGURE: " (tools/gpu/check.sh puts it in its table) and exits 1 when the
comparison fails, printing both values."""
import array
import json
import statistics
import sys


def losses(path):
    return [json.loads(line)["loss"] for line in open(path)]


def weights(path):
    w = array.array("f")
    with open(path, "rb") as f:
        w.frombytes(f.read())
    return w


def compare(a, b, what, tol):
    wa, wb = weights(a + ".bin"), weights(b + ".bin")
    la, lb = losses(a + ".jsonl"), losses(b + ".jsonl")
    if len(wa) != len(wb) or len(la) != len(lb) or not wa:
        print("FIGURE: %s: shapes differ: %d vs %d weights, %d vs %d steps" % (
            what, len(wa), len(wb), len(la), len(lb)))
        return 1
    same_bits = wa.tobytes() == wb.tobytes() and la == lb
    diff = 0.0 if wa.tobytes() == wb.tobytes() else max(abs(x - y) for x, y in zip(wa, wb))
    scale = max(map(abs, wa))
    ldiff = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(la, lb))
    ok = same_bits if tol is None else (diff <= tol * scale and ldiff <= tol)
    print("losses %s: %s" % (a, " ".join("%.6f" % x for x in la)))
    print("losses %s: %s" % (b, " ".join("%.6f" % x for x in lb)))
    comm = [json.loads(line).get("comm_bytes", 0) for line in open(b + ".jsonl")]
    print("FIGURE: %s: %s; %d weights, max |diff| %.3g (max |w| %.3g), loss rel diff %.3g over %d steps%s%s" % (
        what, "bit-identical" if same_bits else ("within %g" % tol if ok else "DIFFERENT"), len(wa), diff, scale,
        ldiff, len(la), "" if tol is None else "; limit %g" % tol,
        "; %s moved %.1f MB/step between ranks" % (b.split("/")[-1], statistics.median(comm) / 1e6)
        if any(comm) else ""))
    return 0 if ok else 1


def stats(path):
    rows = [json.loads(line) for line in open(path)]
    timed = rows[1:] or rows
    med = lambda k: statistics.median(r.get(k, 0) for r in timed)
    step, stall, opt = med("step_s"), med("stall_s"), med("optimizer_s")
    print("FIGURE: %.0f tokens/s, %.1f TFLOPS; step %.2f s = compute %.2f + stall %.2f + optimizer %.2f "
          "(median of %d steps); device peak %.1f GiB, host peak %.1f GiB, NVMe read %.1f GB/step" % (
              med("tokens_per_s"), med("tflops"), step, step - stall - opt, stall, opt, len(timed),
              max(r.get("device_peak_bytes", 0) for r in rows) / 2**30,
              max(r.get("host_peak_bytes", 0) for r in rows) / 2**30, med("nvme_to_host_bytes") / 1e9))
    return 0


def kernels(path):
    import csv
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3,  # ncu's units vary by version
             "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
    head, body = rows[0], rows[1:]
    name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
    ms, calls = {}, {}
    for r in body:
        k = r[name][:90]
        ms[k] = ms.get(k, 0.0) + float(r[value].replace(",", "")) * scale[r[unit]]
        calls[k] = calls.get(k, 0) + 1
    total = sum(ms.values())
    print("%-90s %7s %10s %7s" % ("kernel", "calls", "GPU ms", "share"))
    for k in sorted(ms, key=ms.get, reverse=True)[:40]:
        print("%-90s %7d %10.3f %6.1f%%" % (k, calls[k], ms[k], 100 * ms[k] / total))
    share = {}
    for k, t in ms.items():
        share[kernel_kind(k)] = share.get(kernel_kind(k), 0.0) + t
    # cuBLAS names its TF32 kernels "tf32", CUTLASS's sm80 ones "s1688gemm" without a 16-bit type.
    tf32 = sum(t for k, t in ms.items()
               if "tf32" in k or ("s1688gemm" in k and "bf16" not in k and "f16" not in k))
    print("FIGURE: %d launches, %.1f GPU ms: %s; TF32 products %.0f%%" % (
        sum(calls.values()), total, ", ".join("%s %.0f%%" % (kind, 100 * t / total)
                                              for kind, t in sorted(share.items(), key=lambda x: -x[1])[:6]),
        100 * tf32 / total))
    return 0


KINDS = (("GEMM", ("gemm", "xmma", "nvjet", "splitkreduce")), ("softmax", ("softmax",)),
         ("cross-entropy", ("cross_entropy",)), ("conversions", ("to_f32", "to_bf16", "to_f16")),
         ("LayerNorm", ("layernorm",)), ("GELU", ("gelu",)), ("bias and sums", ("bias", "colsum")),
         ("embedding", ("embed",)), ("Adam", ("adam",)), ("residual", ("residual",)))


def kernel_kind(name):
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(key in low for key in keys)), "other")


def main(argv):
    if len(argv) == 2 and argv[0] == "--kernels":
        return kernels(argv[1])
    if len(argv) == 4 and argv[0] == "--exact":
        return compare(argv[1], argv[2], argv[3], None)
    if len(argv) == 5 and argv[0] == "--tolerance":
        return compare(argv[2], argv[3], argv[4], float(argv[1]))
    if len(argv) == 2 and argv[0] == "--stats":
        return stats(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
