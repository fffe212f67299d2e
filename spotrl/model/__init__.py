"""Everything that runs on the accelerator: transformer, sampler, tokenizer, losses, train step."""
