import sys, re, subprocess, collections
out, binary, lookups = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = {}; cur = None; skip = False
counts = collections.defaultdict(int)  # (fnname, addr) -> Ir
last = [0, 0]
def parse_pos(tok, i):
    if tok.startswith('0x'): v = int(tok, 16)
    elif tok.startswith('+'): v = last[i] + int(tok[1:], 16 if i == 0 else 10) if False else last[i] + int(tok[1:])
    elif tok.startswith('-'): v = last[i] - int(tok[1:])
    elif tok == '*': v = last[i]
    else: v = int(tok)
    last[i] = v; return v
for line in open(out):
    line = line.rstrip('\n')
    m = re.match(r'^fn=\((\d+)\)(?: (.*))?$', line)
    if m:
        if m.group(2): names[m.group(1)] = m.group(2)
        cur = names[m.group(1)]; continue
    m = re.match(r'^c?fn=\((\d+)\) (.*)$', line)
    if m: names[m.group(1)] = m.group(2); continue
    if line.startswith('calls='): skip = True; continue
    if not line or not (line[0].isdigit() or line[0] in '+-*'): continue
    toks = line.split()
    a = parse_pos(toks[0], 0); parse_pos(toks[1], 1)
    if skip: skip = False; continue
    if cur and 'pool_bags' in cur and len(toks) > 2: counts[(cur, a)] += int(toks[2])
# objdump
dis = subprocess.run(['objdump', '-d', '--no-show-raw-insn', '-C', binary], capture_output=True, text=True).stdout
funcs = {}; fname = None
for l in dis.splitlines():
    m = re.match(r'^([0-9a-f]+) <(.*)>:$', l)
    if m: fname = m.group(2); funcs.setdefault(fname, {'start': int(m.group(1), 16), 'ins': {}}); continue
    m = re.match(r'^\s+([0-9a-f]+):\s+(.*)$', l)
    if m and fname: funcs[fname]['ins'][int(m.group(1), 16)] = m.group(2)
tot = collections.Counter()
for fn in sorted({k[0] for k in counts}):
    addrs = {a: c for (f, a), c in counts.items() if f == fn}
    dfn = next((n for n in funcs if n == fn), None)
    if dfn is None: print('no disasm for', fn); continue
    # offset: runtime entry = lowest executed address belonging to entry? use min address mapped
    base = min(addrs) - funcs[dfn]['start'] if False else None
    # find offset so that most executed addrs land on instruction starts
    cands = collections.Counter((a - s) for a in list(addrs)[:50] for s in [funcs[dfn]['start']])
    off = None
    for delta in sorted({a - x for a in list(addrs)[:5] for x in funcs[dfn]['ins']}):
        if all((a - delta) in funcs[dfn]['ins'] for a in addrs): off = delta; break
    if off is None: print('no alignment for', fn); continue
    for a, c in addrs.items():
        ins = funcs[dfn]['ins'][a - off]
        tot['instructions'] += c
        if re.search(r'\((%rsp|%rbp)\)', ins) or re.search(r'\(%r(sp|bp),', ins): tot['stack refs'] += c
        if 'vpinsrq' in ins: tot['vpinsrq'] += c
        if re.match(r'(vpextrq|vinsert[fi]128|vextract[fi]128|vmovq|vmovhps|vmovlps|vpunpck|vshufps|vperm)', ins): tot['lane moves'] += c
        if ins.startswith('prefetch'): tot['prefetch'] += c
        if re.match(r'vaddps', ins): tot['vaddps'] += c
for k in ['instructions', 'stack refs', 'vpinsrq', 'lane moves', 'vaddps', 'prefetch']:
    print(f'  {k:13s} {tot[k]:>12,d}  = {tot[k]/lookups:7.2f} per lookup')
