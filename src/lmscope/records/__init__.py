"""Records: the rows every point writes (`results`), what a results file must hold
(`results_check`), where a row came from (`provenance`, `version`), and the intervals of the
ratios and medians computed from them (`stats`, `bootstrap`)."""
