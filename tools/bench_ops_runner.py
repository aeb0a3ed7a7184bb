#!/usr/bin/env python3
"""Runs the op tests (tests/python/test_ops_*.py) on a host without pytest.

    python tools/bench_ops_runner.py [tests/python/test_ops_*.py ...]

tools/gpu_check.sh uses it when `python -m pytest` is unavailable (a bare GPU host with
only torch). It installs a minimal stand-in for the few pytest features these files use
(mark.parametrize, mark.skipif, skip), expands the parameter grid, runs every test_*
function and exits 1 if any failed. With pytest installed, run pytest instead.
"""
import importlib
import itertools
import pathlib
import sys
import traceback
import types

REPO = pathlib.Path(__file__).resolve().parents[1]


class SkipTest(Exception):
    pass


def _install_pytest_stand_in():
    mod = types.ModuleType("pytest")

    def skip(reason=""):
        raise SkipTest(reason)

    class Mark:
        @staticmethod
        def parametrize(names, values):
            names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)

            def deco(fn):
                fn.__dict__.setdefault("_grid", []).insert(0, (names, list(values)))
                return fn
            return deco

        @staticmethod
        def skipif(condition, reason=""):
            def deco(fn):
                if condition:
                    fn._skip_reason = reason or "skipif"
                return fn
            return deco

    mod.skip = skip
    mod.mark = Mark()
    sys.modules["pytest"] = mod


def _expand(fn):
    grid = getattr(fn, "_grid", [])
    if not grid:
        yield {}
        return
    choices = []
    for names, values in grid:
        choices.append([dict(zip(names, v if len(names) > 1 else (v,))) for v in values])
    for combo in itertools.product(*choices):
        kwargs = {}
        for part in combo:
            kwargs.update(part)
        yield kwargs


def main(argv):
    files = [pathlib.Path(a) for a in argv] or sorted((REPO / "tests" / "python").glob("test_ops_*.py"))
    try:
        import pytest  # noqa: F401
    except ImportError:
        _install_pytest_stand_in()
    sys.path.insert(0, str(REPO / "tests" / "python"))
    passed = failed = skipped = 0
    for path in files:
        module = importlib.import_module(path.stem)
        for name in sorted(n for n in dir(module) if n.startswith("test_")):
            fn = getattr(module, name)
            if not callable(fn) or getattr(fn, "__module__", None) != module.__name__:
                continue
            for kwargs in _expand(fn):
                label = f"{path.name}::{name}[{', '.join(f'{k}={v}' for k, v in kwargs.items())}]"
                if getattr(fn, "_skip_reason", None):
                    skipped += 1
                    print(f"SKIP {label}: {fn._skip_reason}")
                    continue
                try:
                    fn(**kwargs)
                    passed += 1
                except SkipTest as e:
                    skipped += 1
                    print(f"SKIP {label}: {e}")
                except Exception:  # report and continue with the other tests
                    failed += 1
                    print(f"FAIL {label}\n{traceback.format_exc()}")
    print(f"op tests: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
