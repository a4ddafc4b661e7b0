import json, sys
d = json.load(open(sys.argv[1]))
v = d["visits"]; rows = d["rows"]
t0 = min(r["e"] for r in rows)
M = int(sys.argv[2]) if len(sys.argv) > 2 else 4
B = 0.25
out = []
for k in range(0, 21):
    lo, hi = t0 + k * B, t0 + (k + 1) * B
    busy = sum(max(0, min(x["t1"], hi) - max(x["t0"], lo)) for x in v)
    lat = sorted(r["total"] for r in rows if lo <= r["e"] < hi)
    out.append("%4.2f busy=%.2f lat_p50=%5.1f lat_max=%5.1f" % (k * B, busy / (M * B), lat[len(lat)//2] if lat else 0, lat[-1] if lat else 0))
print("\n".join(out))
