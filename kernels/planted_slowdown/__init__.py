"""A patch that is slower on purpose: stock softmax plus a known, fixed amount of extra work per call.

e2eprof uses it to prove its own sensitivity (issue: a planted ~2% slowdown must come out as FAIL), the way a
statistics package checks that its test finds an effect that is known to be there.
"""
