#!/usr/bin/env python3
"""Writes the sm_90a kernels' inline-PTX wgmma wrappers, one per shape they use: the 16-bit ones in two headers
by where A comes from, templates/sm90_wgmma_ss.cuh (A and B from shared memory) and templates/sm90_wgmma_rs.cuh
(A from registers), and the 8-bit ones (k32, both operands K-major) in templates/sm90_wgmma_fp8.cuh.

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
# The FP8 forward's (fwd_sm90.cuh): N of S = Q Kᵀ (a key block of 128, or its half) and of O += P Vᵀ (the values'
# head dim in 64-column chunks), each operand e4m3 or e5m2.
SS8_N = [64, 128]
RS8_N = [64, 128, 192, 256]
TYPES8 = [("kFloat8E4M3", "e4m3"), ("kFloat8E5M2", "e5m2")]


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


def fp8_body(form, n, a_type, b_type):
    regs = n // 2
    if form == "ss8":
        a_operand, a_inputs, after = f"%{regs}", '"l"(desc_a)', 1
    else:
        a_operand = f"{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}"
        a_inputs, after = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])', 4
    return (f'asm volatile(\n'
            f'    "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + after + 1}, 0;\\n"\n'
            f'    "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.{a_type}.{b_type} "\n'
            f'    "{{{acc_list(0, regs)}}}, "\n'
            f'    "{a_operand}, %{regs + after}, p, 1, 1;\\n}}\\n"\n'
            f'    : {acc_operands(n)}\n'
            f'    : {a_inputs}, "l"(desc_b), "r"(accumulate));\n')


def fp8_wrapper(form, n):
    a_param = "u64 desc_a" if form == "ss8" else "const u32 (&a)[4]"
    struct = "WgmmaSS8" if form == "ss8" else "WgmmaRS8"
    out = [f"template <>\nstruct {struct}<{n}> {{\n"
           f"  template <ElemType kA, ElemType kB, int kGroups>\n"
           f"  static __device__ __forceinline__ void run(float (&d)[kGroups][4], {a_param}, u64 desc_b, int accumulate) {{\n"
           f"    static_assert(kGroups >= {n // 8}, \"d holds at least N/8 groups\");\n"]
    first = True  # the last branch, e5m2 both, takes what the others do not: the callers pass FP8 types only
    for a_elem, a_type in TYPES8:
        for b_elem, b_type in TYPES8:
            last = a_elem == TYPES8[-1][0] and b_elem == TYPES8[-1][0]
            if first:
                out.append(f"    if constexpr (kA == ElemType::{a_elem} && kB == ElemType::{b_elem}) {{\n")
            elif last:
                out.append("    } else {\n")
            else:
                out.append(f"    }} else if constexpr (kA == ElemType::{a_elem} && kB == ElemType::{b_elem}) {{\n")
            first = False
            out.append("".join("      " + line + "\n" for line in fp8_body(form, n, a_type, b_type).splitlines()))
    out.append("    }\n  }\n};\n")
    return "".join(out)


def fp8_header():
    out = ["// wgmma.mma_async m64nNk32 (fp32 accumulators, e4m3/e5m2 inputs, both K-major as 8-bit wgmma needs): one per N\n"
           "// the FP8 forward uses. Written by scripts/gen_sm90_wgmma.py (PTX needs one asm statement per accumulator\n"
           "// count); do not edit.\n",
           "#pragma once\n\n",
           '#include "fwd_traits.cuh"\n#include "sm90_primitives.cuh"\n\n',
           "namespace flashgen {\nnamespace sm90 {\n\n",
           ACCUMULATORS.replace("A(64 x 16) B(16 x N)", "A(64 x 32) B(32 x N)"),
           "template <int N>\nstruct WgmmaSS8;  // A and B in shared memory (S = Q Kᵀ)\n",
           "template <int N>\nstruct WgmmaRS8;  // A the 8-bit fragment of the warp's 16 rows, B Vᵀ in shared memory (O += P V)\n\n"]
    out.extend(fp8_wrapper("ss8", n) + "\n" for n in SS8_N)
    out.extend(fp8_wrapper("rs8", n) + "\n" for n in RS8_N)
    out.append("}  // namespace sm90\n}  // namespace flashgen\n")
    return "".join(out)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_sm90_wgmma.py TEMPLATE_DIR")
    for name, text in (("sm90_wgmma_ss.cuh", shared_memory_header()), ("sm90_wgmma_rs.cuh", register_header()),
                       ("sm90_wgmma_fp8.cuh", fp8_header())):
        with open(os.path.join(sys.argv[1], name), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
