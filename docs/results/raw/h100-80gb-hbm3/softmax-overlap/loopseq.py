# loopseq.py SASS : for each loop body containing HGMMA, the order of key events (run-length)
import re, sys
lines = open(sys.argv[1]).read().splitlines()
ins, labels = [], {}
for l in lines:
    m = re.match(r'\s*(\.L_x_\d+):', l)
    if m: labels[m.group(1)] = len(ins); continue
    m = re.match(r'\s*/\*([0-9a-f]+)\*/\s+(.*?);', l)
    if m: ins.append(m.group(2).strip())
KEY = ('HGMMA', 'DEPBAR', 'MUFU', 'VOTE', 'BRA', 'FMUL', 'F2FP', 'BAR.', 'SYNCS', 'SHFL')
for i, t in enumerate(ins):
    m = re.search(r'BRA[.\w]*\s+`\((\.L_x_\d+)\)', t)
    if m and labels.get(m.group(1), 1 << 30) < i:
        s = labels[m.group(1)]
        body = ins[s:i + 1]
        if not any('HGMMA' in x for x in body) or len(body) < 300: continue
        out, prev = [], None
        for j, x in enumerate(body):
            op = re.sub(r'^@!?U?P\w+\s+', '', x).split()[0]
            k = next((k for k in KEY if k in op), None)
            if not k: continue
            k = op if k in ('DEPBAR', 'BAR.') else k
            if k == prev: out[-1][1] += 1
            else: out.append([f"{j}:{k}", 1]); prev = k
        print(f"loop {s}-{i} ({len(body)} instr):", ' '.join(a + (f"x{n}" if n > 1 else '') for a, n in out)); print()
