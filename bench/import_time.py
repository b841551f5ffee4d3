"""Time of `import flashgen.torch` after `import torch`, in fresh processes (median of --runs), and which of torch's
heavy modules the import pulls in (torch._dynamo, torch._inductor, sympy: the goal is none).
    FLASHGEN_LIBRARY=build/libflashgen.so python bench/import_time.py [--runs 5] [--module flashgen.torch] [--csv FILE]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import torch
start = time.perf_counter()
import {module}
seconds = time.perf_counter() - start
heavy = [m for m in ("torch._dynamo", "torch._inductor", "sympy", "torch.fx.experimental.symbolic_shapes")
         if m in sys.modules]
print(json.dumps({{"seconds": seconds, "heavy": heavy, "torch": torch.__version__}}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--module", default="flashgen.torch")
    parser.add_argument("--csv")
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.path.join(here, "..", "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    results = []
    for _ in range(args.runs):
        done = subprocess.run([sys.executable, "-c", CHILD.format(module=args.module)], env=env, check=True,
                              capture_output=True, text=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    seconds = [r["seconds"] for r in results]
    heavy = sorted({m for r in results for m in r["heavy"]})
    import torch
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    line = (f"{device},{datetime.date.today().isoformat()},{results[0]['torch']},{args.module},{args.runs},"
            f"{statistics.median(seconds):.4f},{min(seconds):.4f},{max(seconds):.4f},{' '.join(heavy) or 'none'}")
    text = "device,date,torch,module,runs,median_s,min_s,max_s,heavy_modules_imported\n" + line + "\n"
    sys.stdout.write(text)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
