"""Sign-off where teams sign: a run's verdicts as verdict.json, JUnit XML and a CI step summary, and `gate`, which
re-judges a finished run under another policy without measuring again."""
