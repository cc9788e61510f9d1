"""Paper B's trajectories: per-loop KL, state change and CE, convergence, settling, token
types.
"""
