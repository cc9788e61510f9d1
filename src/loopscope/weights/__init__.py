"""weights: everything that sets a trained model's weights (config, model, depth sampler,
data, tokenizer, training, checkpoints); an edit here retrains."""
