"""measure: what measures a trained model (extract, diagnostics, the clamp, trajectories,
exit rules, the masked forward, the runtime, intervals); an edit reruns measurements."""
