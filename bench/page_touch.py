#!/usr/bin/env python3
"""First-touch cost of memory pages, as the CPU backend's KV pools and weights meet it
(docs/performance-cpu.md, "Memory placement"): maps MIB MiB of anonymous memory, once on 4 KiB
pages (MADV_NOHUGEPAGE) and once asking for 2 MiB huge pages (MADV_HUGEPAGE), writes one byte
per 4 KiB, and prints the time of that first pass, per page, and of a second pass over the
same (now resident) memory. Each kind runs ROUNDS times, alternating.
Usage: bench/page_touch.py [MIB (default 64)] [ROUNDS (default 3)]"""
import mmap
import sys
import time

SMALL, HUGE = 4096, 2 << 20


def touch(buf, size):
    t0 = time.perf_counter()
    for off in range(0, size, SMALL):
        buf[off] = 1
    return time.perf_counter() - t0


def run(size, advice):
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(advice)
    first = touch(buf, size)
    second = touch(buf, size)
    buf.close()
    return first, second


def main():
    try:
        mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
        rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
        if mib < 2 or rounds < 1:
            raise ValueError
    except ValueError:
        sys.exit(f"{sys.argv[0]}: usage: {sys.argv[0]} [MIB >= 2] [ROUNDS >= 1]")
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        sys.exit(f"{sys.argv[0]}: this Python/OS has no MADV_HUGEPAGE (Linux with transparent huge pages needed)")
    size = mib << 20
    kinds = [("4 KiB pages", mmap.MADV_NOHUGEPAGE, SMALL), ("2 MiB huge pages", mmap.MADV_HUGEPAGE, HUGE)]
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {mib} MiB, transparent huge pages: {thp}")
    print("| pages | first touch ms | per page | second touch ms |")
    print("| --- | --- | --- | --- |")
    for _ in range(rounds):
        for name, advice, page in kinds:
            first, second = run(size, advice)
            per_page = first / (size // page)
            unit = f"{per_page * 1e3:.2f} ms" if per_page >= 1e-3 else f"{per_page * 1e6:.1f} µs"
            print(f"| {name} | {first * 1e3:.1f} | {unit} | {second * 1e3:.1f} |")


if __name__ == "__main__":
    main()
