"""loopscope: train looped language models and measure what happens inside their loops.

Each subpackage is a rerun reason (docs/architecture.md): base < weights < preflight <
measure < judge < render < tools. The package files hold a docstring alone (a test keeps
it so), which is why no stage lists them as dependencies: they run no code.
"""
