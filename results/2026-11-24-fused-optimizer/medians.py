import sys,statistics as st,collections
for f in sys.argv[1:]:
    d=collections.defaultdict(lambda:([],[]))
    for l in open(f):
        p=l.split()
        if len(p)<4: continue
        try: d[p[1]][0].append(float(p[2])); d[p[1]][1].append(float(p[3]))
        except: pass
    out=[]
    for k,(fw,bw) in sorted(d.items()):
        out.append(f"{k}: n={len(bw)} fwd med {st.median(fw):.2f} bwd med {st.median(bw):.2f} [{min(bw):.2f}-{max(bw):.2f}]")
    print(f.split('/')[-1], ' | '.join(out))
