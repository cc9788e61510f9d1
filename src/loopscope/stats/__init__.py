"""Statistics without torch: resampling units and bootstrap intervals, shared by the
measuring stages and the judges.
"""
