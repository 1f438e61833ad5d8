"""The decoder (Qwen3 / Llama 3) and its Hugging Face checkpoint I/O."""
