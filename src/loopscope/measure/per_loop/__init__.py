"""Paper A's per-loop measurements: the extract of every loop's state, the depth sweep, the
scale clamp, throughput.
"""
