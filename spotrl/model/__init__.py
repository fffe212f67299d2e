"""The network and what describes it: the Flax NNX transformer (Qwen2/Llama family), the critic, the
policy's static parts and parameter conversion, the batch layout of sequences, sharding rules,
memory estimates, compile counting, character tokenizers; model/hf/ reads and writes Hugging Face
checkpoints. Sampling is `spotrl.rollout`, losses and the train step `spotrl.rl`."""
