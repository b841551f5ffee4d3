#!/usr/bin/env python3
"""Writes the sm_90a kernels' inline-PTX wgmma wrappers, one per shape they use, in two headers by where A
comes from: templates/sm90_wgmma_ss.cuh (A and B from shared memory) and templates/sm90_wgmma_rs.cuh (A from
registers).

PTX takes a wgmma's accumulators as one brace list of registers, so each N needs its own asm statement;
this script writes them out instead of a person. Rerun after changing the shape lists below:
    python3 scripts/gen_sm90_wgmma.py templates
"""
import os
import sys

# N of S = Q Kᵀ (the key block, A and B from shared memory) and of O += P V (head_dim, A from registers,
# or from shared memory K-major with B MN-major; 8 for the row sums of P); N of the backward's dQ = dS K
# (A and B from shared memory, both MN-major).
SS_N = [32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192]  # 32, 48: half key blocks (fwd_sm90.cuh)
RS_N = [8, 64, 96, 128, 192, 256]  # 8: P times a block of ones, the rows' sums (tensor_sum)
SSKMN_N = RS_N
SSMN_N = [64, 128]
TYPES = [("kFloat16", "f16"), ("kBFloat16", "bf16")]


def acc_list(first, count):
    return ", ".join(f"%{first + i}" for i in range(count))


def acc_operands(n):
    return ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(n // 2))


def ss(n, ptx_type):
    regs = n // 2
    return (f'    asm volatile(\n'
            f'        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"\n'
            f'        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx_type}.{ptx_type} "\n'
            f'        "{{{acc_list(0, regs)}}}, "\n'
            f'        "%{regs}, %{regs + 1}, p, 1, 1, {{TRANS_A}}, {{TRANS_B}};\\n}}\\n"\n'
            f'        : {acc_operands(n)}\n'
            f'        : "l"(desc_a), "l"(desc_b), "r"(accumulate));\n')


def rs(n, ptx_type):
    regs = n // 2
    return (f'    asm volatile(\n'
            f'        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n"\n'
            f'        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx_type}.{ptx_type} "\n'
            f'        "{{{acc_list(0, regs)}}}, "\n'
            f'        "{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1, {{TRANS_B}};\\n}}\\n"\n'
            f'        : {acc_operands(n)}\n'
            f'        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));\n')


def wrapper(form, n):
    body = rs if form == "rs" else ss
    a_param = "const u32 (&a)[4]" if form == "rs" else "u64 desc_a"
    trans_a = 1 if form == "ssmn" else 0
    trans_b = 0 if form == "ss" else 1
    struct = {"ss": "SS", "rs": "RS", "sskmn": "SSKMN", "ssmn": "SSMN"}[form]
    out = [f"template <>\nstruct Wgmma{struct}<{n}> {{\n"
           f"  template <ElemType kElem, int kGroups>\n"
           f"  static __device__ __forceinline__ void run(float (&d)[kGroups][4], {a_param}, u64 desc_b, int accumulate) {{\n"
           f"    static_assert(kGroups >= {n // 8}, \"d holds at least N/8 groups\");\n"]
    for i, (elem, ptx_type) in enumerate(TYPES):
        out.append(f"    {'if' if i == 0 else '} else'} constexpr (kElem == ElemType::{elem}) {{\n" if i == 0 else "    } else {\n")
        out.append("  " + body(n, ptx_type).replace("{TRANS_A}", str(trans_a)).replace("{TRANS_B}", str(trans_b))
                   .replace("\n    ", "\n      "))
    out.append("    }\n  }\n};\n")
    return "".join(out)


# D's layout, which every wrapper of both headers shares.
ACCUMULATORS = """// D(64 x N) (+)= A(64 x 16) B(16 x N). The first N/8 groups of four of d hold this thread's accumulators:
// d[i][0..1] at (row lane/4, columns 8i + 2(lane%4) + {0,1}) of its warp's 16 rows, d[i][2..3] at
// row lane/4 + 8. accumulate = 0 overwrites D.
"""


def header(what, declarations, wrappers):
    out = [f"// wgmma.mma_async m64nNk16 (fp32 accumulators, fp16/bf16 inputs), {what}: one per N the kernels use.\n"
           "// Written by scripts/gen_sm90_wgmma.py (PTX needs one asm statement per accumulator count); do not edit.\n",
           "#pragma once\n\n",
           '#include "sm90_primitives.cuh"\n\n',
           "namespace flashgen {\nnamespace sm90 {\n\n",
           ACCUMULATORS]
    for name, comment in declarations:
        out.append(f"template <int N>\nstruct {name};  // {comment}\n")
    out.append("\n")
    out.extend(w + "\n" for w in wrappers)
    out.append("}  // namespace sm90\n}  // namespace flashgen\n")
    return "".join(out)


def shared_memory_header():
    return header("A and B in shared memory", [
        ("WgmmaSS", "both K-major (S = Q Kᵀ)"),
        ("WgmmaSSKMN", "A K-major and B MN-major (O += P V with P staged in shared memory)"),
        ("WgmmaSSMN", "both MN-major (dQ = dS K from dSᵀ and K)"),
    ], [wrapper("ss", n) for n in SS_N] + [wrapper("sskmn", n) for n in SSKMN_N] + [wrapper("ssmn", n) for n in SSMN_N])


def register_header():
    return header("A in registers", [
        ("WgmmaRS", "A the m16n8k16 A fragment of the warp's 16 rows, B MN-major (O += P V)"),
    ], [wrapper("rs", n) for n in RS_N])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_sm90_wgmma.py TEMPLATE_DIR")
    for name, text in (("sm90_wgmma_ss.cuh", shared_memory_header()), ("sm90_wgmma_rs.cuh", register_header())):
        with open(os.path.join(sys.argv[1], name), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
