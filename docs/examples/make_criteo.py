import random, sys
# 20000 Criteo-format lines (label, I1..I13, C1..C26), skewed categorical values, fixed seed.
random.seed(1)
with open(sys.argv[1], "w") as f:
    for i in range(20000):
        ints = [str(random.randint(0, 50)) for _ in range(13)]
        cats = ["%08x" % int((10 ** (2 + c % 5)) * random.random() ** 3) for c in range(26)]
        f.write("\t".join([str(i % 2)] + ints + cats) + "\n")
