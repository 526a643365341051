#!/bin/sh
# One device call: ncu kernel times of one hybrid-modes decode step per profile, summed by kernel.
# PROFILES: name:context:config entries (default: full attention at 4K, pre-speculative and
# pre-verified at 32K); PROFILE_S seconds each at most (default 110). Prepare as hybrid-run.sh (the
# hybrid-modes bundle and both libraries, in DEVICE_DIR).
set -u
. "$(dirname "$0")/device-env.sh"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee "$OUT/gpu.txt"
for p in ${PROFILES:-full-4k:4096:full prespec-32k:32768:pre-speculative prever-32k:32768:pre-verified}; do
  name=${p%%:*}; rest=${p#*:}; ctx=${rest%%:*}; config=${rest#*:}
  # Unlocked clocks (the bench's own); kernels run one at a time under ncu, so sums exceed wall time a little.
  timeout "${PROFILE_S:-110}" "$NCU" --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --print-units base \
    bun "$DEVICE_DIR/hybrid-modes.js" --steps 8 --profile-step 6 --contexts "$ctx" --configs "$config" > "$OUT/$name.csv" 2> "$OUT/$name.err"
  echo "$name exit $?"; tail -2 "$OUT/$name.err" | cut -c1-300
  python3 - "$OUT/$name.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)  # the bench prints lines with commas too
if start is None: print("no kernel rows"); sys.exit()
h = rows[start]; ki = h.index("Kernel Name"); vi = h.index("Metric Value")
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows[start + 1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    a = agg[r[ki][:70]]; a[0] += 1; a[1] += v
print(f"kernels {sum(a[0] for a in agg.values())}, total {sum(a[1] for a in agg.values()) / 1e6:.3f} ms")
for k, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1])[:22]: print(f"{t / 1e6:8.3f} ms {n:5d}x  {k}")
PY
done
