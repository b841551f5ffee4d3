"""The custom ops' schemas, with no torch needed: the C++ op library (python/csrc/ops_library.cpp) defines each op
with the same text as flashgen.torch's Python definitions (flashgen/torch/_schemas.py), so torch.ops.flashgen.* is the
same in both backends (and a program exported with one runs with the other)."""

import ast
import re

import testsupport

CPP = testsupport.PYTHON_DIR / "csrc" / "ops_library.cpp"
SCHEMAS_PY = testsupport.PYTHON_DIR / "flashgen" / "torch" / "_schemas.py"


def _schema_values():
    """The constants of _schemas.py (SCHEMAS, MUTATES, VARIANT_SCHEMAS), read without importing flashgen.torch (which
    needs torch)."""
    tree = ast.parse(SCHEMAS_PY.read_text())
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def _python_schemas():
    values = _schema_values()
    return values["SCHEMAS"], values["MUTATES"]


def _cpp_schemas():
    """{name: "(arguments) -> returns"} of every m.def in the C++ library, its adjacent string literals joined."""
    schemas = {}
    for call in re.findall(r"m\.def\(((?:\s*\"(?:[^\"\\]|\\.)*\")+)\s*\);", CPP.read_text()):
        text = "".join(re.findall(r"\"((?:[^\"\\]|\\.)*)\"", call)).replace('\\"', '"')
        name, rest = text.split("(", 1)
        schemas[name] = "(" + rest
    return schemas


def test_cpp_and_python_define_the_same_schemas():
    python, _ = _python_schemas()
    cpp = _cpp_schemas()
    assert sorted(cpp) == sorted(python)
    for name in python:
        assert cpp[name] == python[name], f"{name}: C++ {cpp[name]!r} != Python {python[name]!r}"


def test_every_cpp_op_has_a_kernel_and_mutations_match_the_schema():
    python, mutates = _python_schemas()
    registered = re.findall(r"m\.impl\(\"(\w+)\"", CPP.read_text())
    assert sorted(registered) == sorted(python)
    for name, schema in python.items():
        written = set(re.findall(r"Tensor\(\w+!\) (\w+)", schema))
        assert written == set(mutates.get(name, ())), name


def test_the_variant_ops_mutate_what_their_schemas_write():
    """The Python-defined variant ops: the arguments each schema marks written (the KV-cache one's caches) are
    exactly MUTATES' (torch.library.custom_op is given them), and no other op is listed there."""
    values = _schema_values()
    variants, mutates = values["VARIANT_SCHEMAS"], values["MUTATES"]
    assert set(mutates) <= set(values["SCHEMAS"]) | set(variants)
    for name, schema in variants.items():
        written = set(re.findall(r"Tensor\(\w+!\) (\w+)", schema))
        assert written == set(mutates.get(name, ())), name
    assert mutates["variant_attention_kvcache"] == ("k_cache", "v_cache")
