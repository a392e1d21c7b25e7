"""The loops and models e2eprof times, installed as `e2eprof.workloads`. Never a top-level `workloads`
(see e2eprof.shadowing)."""

if __name__ == "workloads":  # found under its bare name because the checkout is on sys.path
    from e2eprof.shadowing import yield_name

    yield_name(globals())
