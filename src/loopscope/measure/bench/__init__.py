"""The exit runtime and its benchmark: only the bench stages run these.
"""
