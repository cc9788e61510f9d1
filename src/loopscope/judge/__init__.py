"""judge: the verdict rules and both papers' claims, on stored measurements; no torch, so
an edit reruns the claims, the reports and the summary alone."""
