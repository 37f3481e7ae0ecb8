"""Summarises bench/quant_bench.sh's interleaved runs: medians per kind and the int8/bf16 ratio."""
import json
import statistics
import sys

runs = {"bf16": [], "int8": []}
for line in sys.stdin:
    kind, text = line.split(" ", 1)
    runs[kind].append(json.loads(text))


def median(kind, key):
    return statistics.median(r[key] for r in runs[kind])


for kind, rs in runs.items():
    print("{}: decode {:.2f} tok/s (runs {}), weights/step {:.0f} MB, copy {:.1f} GB/s, roofline {:.2f}, "
          "prefill {:.0f} tok/s, peak RSS {:.0f} MB".format(
              kind, median(kind, "decode_tok_s"), [round(r["decode_tok_s"], 2) for r in rs],
              rs[0]["weight_bytes"] / 1e6, median(kind, "bandwidth_gb_s"), median(kind, "roofline_fraction"),
              median(kind, "prefill_tok_s"), rs[0]["peak_rss_bytes"] / 1e6))
print("int8 / bf16 decode: {:.2f}x".format(median("int8", "decode_tok_s") / median("bf16", "decode_tok_s")))
