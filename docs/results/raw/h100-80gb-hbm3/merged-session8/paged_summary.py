import json, glob, sys, statistics as st
d = sys.argv[1]
bins, ratios, anchors = [], {}, {}
for f in sorted(glob.glob(f"{d}/prefill-*-r*.json")):
    b = f.rsplit("/", 1)[1][len("prefill-"):].rsplit("-r", 1)[0]
    if b not in bins: bins.append(b)
    by = {}
    for x in json.load(open(f))["results"]:
        if x.get("tflops"):
            base, _, tag = x["case"]["name"].rpartition("_causal_bf16_")
            by.setdefault(base, {})[tag] = x["tflops"]
    for base, row in by.items():
        dn = [row[k] for k in ("dense", "dense-end") if k in row]
        if not dn: continue
        anchor = sum(dn) / len(dn)
        anchors.setdefault(b, []).append(anchor)
        for tag, v in row.items():
            if tag.startswith("dense") or "fwd_sm80" in tag: continue
            ratios.setdefault((base.split("_")[1], tag), {}).setdefault(b, []).append(v / anchor)
pref = ("base", "new", "all", "solo3", "leaderonly")
order = [b for b in pref if b in bins] + [b for b in bins if b not in pref]
print("ratio to the dense anchor (mean of dense and dense-end, same run): median (runs)")
print(f"{'chunk':7s} {'row':15s} " + " ".join(f"{b:20s}" for b in order))
for key in sorted(ratios, key=lambda k: (int(k[0][2:]), k[1])):
    cells = []
    for b in order:
        r = ratios[key].get(b, [])
        cells.append(f"{st.median(r):.3f} ({' '.join(f'{x:.3f}' for x in r)})" if r else "-")
    print(f"{key[0]:7s} {key[1]:15s} " + " ".join(f"{c:20s}" for c in cells))
for b in order:
    a = anchors.get(b, [])
    print(f"{b}: dense anchor {min(a):.0f}-{max(a):.0f} TFLOPS" if a else b)
