#!/usr/bin/env python3
"""The resources of each CUDA kernel of gpu/cuda/kernels.cu and kernels_half.cu for sm_90 (registers,
stack frame, spill stores and loads, static shared memory), as `nvcc -Xptxas -v` reports them, against the
checked-in table gpu/cuda/kernel_resources_sm90.txt.

usage: tools/gpu/kernel_resources.py [--nvcc NVCC] [--check] [--write FILE]
  --check   compare with the table; exit 1 when a kernel spills or uses more stack than the table
            says (any nvcc), or when registers, stack or shared memory differ at all under the
            nvcc release the table was made with, or when kernels were added or removed
  --write   write the fresh table to FILE (`--write gpu/cuda/kernel_resources_sm90.txt` updates it)

The compile uses the flags of the build (-fmad=false, C++17, NDEBUG): tests/gpu/CMakeLists.txt
runs `--check` as the test gpu_kernel_resources_sm90 wherever nvcc is found, and tools/gpu/run.sh
on the GPU machine.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = [os.path.join(ROOT, "gpu", "cuda", f) for f in ("kernels.cu", "kernels_half.cu")]
TABLE = os.path.join(ROOT, "gpu", "cuda", "kernel_resources_sm90.txt")
FIELDS = ("registers", "stack", "spill_stores", "spill_loads", "smem")


def nvcc_release(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+\.\d+), (V[\d.]+)", out)
    return (m.group(1), m.group(2)) if m else ("?", "?")


def short_name(demangled):
    """'void strata::gpu::cuda_detail::(anonymous namespace)::gather_kernel<true, float>(...)' -> 'gather_kernel<true,float>'."""
    name = demangled.replace("(anonymous namespace)::", "")
    name = name[5:] if name.startswith("void ") else name
    name = name.split("(")[0]
    head, angle, tail = name.partition("<")
    # Template arguments without namespaces or spaces ('update_kernel<strata::Bf16, float>' ->
    # 'update_kernel<Bf16,float>'): a name is one word of the table.
    return head.split("::")[-1] + angle + tail.replace("strata::", "").replace(" ", "")


def demangle(names):
    filt = shutil.which("c++filt") or shutil.which("cu++filt")
    if not filt:
        return {n: n for n in names}
    out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True, check=True).stdout.splitlines()
    return dict(zip(names, out))


def measure(nvcc):
    kernels = {}
    for source in SOURCES:
        kernels.update(measure_source(nvcc, source))
    return kernels


def measure_source(nvcc, source):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, "-I" + ROOT, "-DNDEBUG", "-O3", "-std=c++17", "-fmad=false",
               "--generate-code=arch=compute_90,code=sm_90", "-Xptxas", "-v", "-x", "cu", "-c", source,
               "-o", os.path.join(tmp, "kernels.o")]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("kernel_resources.py: nvcc failed:\n" + " ".join(cmd) + "\n" + r.stdout + r.stderr)
    kernels, current = {}, None
    for line in (r.stdout + r.stderr).splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for 'sm_90'", line)
        if m:
            current = m.group(1)
            kernels[current] = dict.fromkeys(FIELDS, 0)
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            k = kernels[current]
            k["stack"], k["spill_stores"], k["spill_loads"] = (int(g) for g in m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            kernels[current]["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            kernels[current]["smem"] = int(s.group(1)) if s else 0
    names = demangle(list(kernels))
    return {short_name(names[k]): v for k, v in kernels.items()}


def write(path, table, version):
    with open(path, "w") as f:
        f.write("# Resources of each kernel of gpu/cuda/kernels.cu and kernels_half.cu for sm_90, as\n"
                "# `nvcc -Xptxas -v` reports them (bytes for stack, spills and static shared memory). Made by\n"
                "# tools/gpu/kernel_resources.py --write; the test gpu_kernel_resources_sm90 compares a fresh\n"
                "# compile with it: more spill or stack than here fails under any nvcc, any other change under\n"
                "# the release below.\n")
        f.write(f"# nvcc: {version[0]} {version[1]}\n")
        f.write("# kernel" + "".join(f" {x}" for x in FIELDS) + "\n")
        for name in sorted(table):
            f.write(name + "".join(f" {table[name][x]}" for x in FIELDS) + "\n")


def read(path):
    table, release = {}, None
    for line in open(path):
        m = re.match(r"# nvcc: (\S+)", line)
        if m:
            release = m.group(1)
        if line.startswith("#") or not line.strip():
            continue
        parts = line.split()
        table[parts[0]] = dict(zip(FIELDS, (int(x) for x in parts[1:])))
    return table, release


def check(fresh, version):
    table, release = read(TABLE)
    same = release == version[0]
    errors, notes = [], []
    for name in sorted(set(table) | set(fresh)):
        if name not in fresh:
            errors.append(f"{name}: in the table, not in kernels.cu or kernels_half.cu")
            continue
        if name not in table:
            errors.append(f"{name}: not in the table ({fresh[name]})")
            continue
        t, f = table[name], fresh[name]
        for x in ("spill_stores", "spill_loads", "stack"):
            if f[x] > t[x]:
                errors.append(f"{name}: {x} {f[x]} bytes, the table says {t[x]}")
        for x in FIELDS:
            if f[x] != t[x] and not (x in ("spill_stores", "spill_loads", "stack") and f[x] > t[x]):
                (errors if same else notes).append(f"{name}: {x} {f[x]}, the table says {t[x]}")
    return errors, notes, release


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--write")
    a = ap.parse_args()
    version = nvcc_release(a.nvcc)
    fresh = measure(a.nvcc)
    print(f"nvcc {version[0]} ({version[1]}), sm_90:")
    print(f"  {'kernel':32s}" + "".join(f"{x:>13s}" for x in FIELDS))
    for name in sorted(fresh):
        print(f"  {name:32s}" + "".join(f"{fresh[name][x]:13d}" for x in FIELDS))
    if a.write:
        write(a.write, fresh, version)
        print(f"wrote {a.write}")
    if a.check:
        errors, notes, release = check(fresh, version)
        for n in notes:
            print(f"note (nvcc {version[0]}, the table's is {release}): {n}")
        for e in errors:
            print(f"ERROR: {e}")
        if errors:
            print("kernel resources differ from gpu/cuda/kernel_resources_sm90.txt: remove the spill, or, if the change "
                  "is meant, update the table (tools/gpu/kernel_resources.py --write gpu/cuda/kernel_resources_sm90.txt)")
            return 1
        print("kernel resources match gpu/cuda/kernel_resources_sm90.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
