"""One timed pass of DeepSpeed's aio_handle for benchmarks/io_peers.sh, the way DeepSpeed's swapper uses it:
sync_pwrite / sync_pread of one pinned tensor (new_cpu_locked_tensor) over the whole file, O_DIRECT (DeepSpeed
opens with it), no validation. Prints one JSON line like benchmarks/b_aio.

  python io_peers_ds.py --check                         exit 0 when the op loads, else print why and exit 1
  python io_peers_ds.py FILE write|read SIZE BLOCK QD   time one pass
"""
import json
import sys
import time


def load_aio():
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 1):
        # For torch < 2.1 the builder swaps -std=c++17 for c++14, which its own sources no longer compile with
        # (and, on some versions, removes a flag it never added); C++17 is what torch 1.13's headers need too.
        AsyncIOBuilder.cxx_args = lambda self: ["-O2", "-std=c++17", "-g", "-Wall", "-shared", "-fPIC",
                                                "-Wno-reorder"]
    return torch, AsyncIOBuilder().load(verbose=False)


def main():
    if sys.argv[1:] == ["--check"]:
        try:
            import deepspeed
            load_aio()
        except Exception as e:  # any failure means the peer is skipped, and the reason is printed
            print(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return 1
        print(f"deepspeed {deepspeed.__version__}")
        return 0
    path, op, size, block, qd = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    torch, aio = load_aio()
    # aio_handle(block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism): DeepSpeed's
    # defaults but for the block size and queue depth, one thread like b_aio's one ring.
    h = aio.aio_handle(block, qd, False, True, 1)
    buf = h.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
    buf.fill_(7)  # touch every page before the clock starts
    t0 = time.perf_counter()
    done = h.sync_pwrite(buf, path) if op == "write" else h.sync_pread(buf, path)
    seconds = time.perf_counter() - t0
    h.free_cpu_locked_tensor(buf)
    if done != 1:
        print(f"aio_handle.sync_p{op} completed {done} ops, expected 1", file=sys.stderr)
        return 1
    print(json.dumps({"op": op, "bytes": size, "seconds": seconds, "gbps": size / seconds / 1e9, "direct": True,
                      "verified": False}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
