"""The exit rules: their data (rules), signals, the rules, the probe, the masked forward
and its control loop, the sweep of settings (policies).
"""
