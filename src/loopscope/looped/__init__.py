"""The looped-model contract: what a model must provide to be measured (interface) and the
types it is written in (types). Every model, trained or released, implements it; nothing
here knows a model.
"""
