"""What the worker check programs (torch_api_checks.py, torch_gpu_checks.py) share: each check
prints "ok NAME" or "FAIL NAME: traceback" and the run goes on, so one defect does not hide others."""
import traceback

failures = []


def check(name, after=None):
    """Decorator: runs the function at once (then `after()`, e.g. a device synchronize) and reports."""
    def wrap(fn):
        try:
            fn()
            if after is not None:
                after()
            print(f"ok {name}", flush=True)
        except Exception:
            failures.append(name)
            print(f"FAIL {name}: {traceback.format_exc()}", flush=True)
        return fn
    return wrap


def expect_error(kinds, fn, *args, **kwargs):
    """The exception of one of `kinds` that fn(*args, **kwargs) raised; AssertionError if none."""
    try:
        fn(*args, **kwargs)
    except kinds as e:
        return e
    raise AssertionError(f"{fn.__name__} raised no {kinds}")
