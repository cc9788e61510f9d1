"""loopscope: train looped language models and measure what happens inside their loops."""
