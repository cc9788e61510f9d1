"""preflight: memory and disk checks before compute is spent; run by configure and the
measuring stages, never by training."""
