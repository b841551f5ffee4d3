#!/usr/bin/env python3
"""Runs flashgen's Python tests: with pytest when it is installed (arguments are passed on to it), else with a
small stand-in for the few pytest features these tests use (parametrize, skip, raises), for machines where pytest
cannot be installed. Either way the last line is pytest-style ("N passed, N failed, N skipped") and the exit
status is nonzero when a test failed.

    python3 python/tests/run_all.py [-k substring] [test_file.py ...]
"""

import importlib
import pathlib
import re
import sys
import time
import traceback
import types

TESTS_DIR = pathlib.Path(__file__).resolve().parent


class Skipped(Exception):
    """pytest.skip(): the test (or, from module level, the module) does not apply here."""


class _Raises:
    def __init__(self, expected, match):
        self.expected, self.match, self.value = expected, match, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected):
            return False
        if self.match is not None and not re.search(self.match, str(value)):
            raise AssertionError(f"{kind.__name__}({value!s}) does not match {self.match!r}")
        self.value = value
        return True


def _parametrize(names, values, ids=None):
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)

    def mark(function):
        cases = []
        for i, value in enumerate(values):
            value = value if len(names) > 1 else (value,)
            cases.append((ids[i] if ids else str(i), dict(zip(names, value))))
        # Stacked decorators multiply, as in pytest.
        previous = getattr(function, "_cases", [("", {})])
        function._cases = [(f"{a}-{b}".strip("-"), {**pa, **pb}) for b, pb in cases for a, pa in previous]
        return function

    return mark


def _skip(reason="", allow_module_level=False):
    del allow_module_level  # a skip at import time skips the module either way
    raise Skipped(reason)


def _fail(reason=""):
    raise AssertionError(reason)


def _stand_in_pytest():
    module = types.ModuleType("pytest")
    module.skip = _skip
    module.fail = _fail
    module.raises = lambda expected, match=None: _Raises(expected, match)
    module.mark = types.SimpleNamespace(parametrize=_parametrize)
    return module


def _run_stand_in(arguments):
    sys.modules["pytest"] = _stand_in_pytest()
    sys.path.insert(0, str(TESTS_DIR))
    selector = arguments[arguments.index("-k") + 1] if "-k" in arguments else None
    files = [a for a in arguments if a.endswith(".py")] or sorted(p.name for p in TESTS_DIR.glob("test_*.py"))
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    start = time.time()
    for file in files:
        name = pathlib.Path(file).stem
        try:
            module = importlib.import_module(name)
        except Skipped as skip:
            print(f"{name}.py SKIPPED (whole module): {skip}", flush=True)
            counts["skipped"] += 1
            continue
        for attribute, test in list(vars(module).items()):  # definition order
            if not attribute.startswith("test_") or not callable(test):
                continue
            for case_id, kwargs in getattr(test, "_cases", [("", {})]):
                label = f"{name}.py::{attribute}" + (f"[{case_id}]" if case_id else "")
                if selector and selector not in label:
                    continue
                try:
                    test(**kwargs)
                    counts["passed"] += 1
                    print(f"{label} PASSED", flush=True)
                except Skipped as skip:
                    counts["skipped"] += 1
                    print(f"{label} SKIPPED: {skip}", flush=True)
                except Exception:  # noqa: BLE001 - every failure is reported, the run goes on
                    counts["failed"] += 1
                    print(f"{label} FAILED\n{traceback.format_exc()}", flush=True)
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
          f"in {time.time() - start:.1f}s")
    return 1 if counts["failed"] else 0


def main(arguments):
    try:
        import pytest
    except ImportError:
        print("pytest is not installed: running the tests with run_all.py's stand-in", flush=True)
        return _run_stand_in(arguments)
    files_given = any(a.endswith(".py") for a in arguments)
    options = ["-rs", "-p", "no:cacheprovider"]  # skip reasons; no .pytest_cache in the source tree
    return pytest.main([*options, *arguments] if files_given else [*options, str(TESTS_DIR), *arguments])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
