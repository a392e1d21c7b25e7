"""From measured steps to a verdict: statistics, summaries, verdicts and their reasons, the Amdahl explanation, team policies."""
