"""The correctness checks beside the per-call ones in e2eprof.patching: model-level comparison with fp64, unseen shapes, numeric-range stress, tensor comparison rules."""
