"""Released looped checkpoints: a registry of layouts, one shared loader, one file per
layout. Only the outside stages (and configure, plan) run this package.
"""
