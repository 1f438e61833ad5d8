"""jaxrubric: rubric-based reinforcement learning of language models in JAX/Flax."""

from jaxrubric import cuda_plugin

cuda_plugin.load_quietly()  # before JAX loads its plugins: see cuda_plugin

from jaxrubric.models.config import ModelConfig, RopeConfig, tiny_config
from jaxrubric.models.hf import load_pretrained, load_tokenizer, save_pretrained
from jaxrubric.models.transformer import Decoder, KVCache, init_model

__all__ = [
    "Decoder", "KVCache", "ModelConfig", "RopeConfig", "init_model", "load_pretrained",
    "load_tokenizer", "save_pretrained", "tiny_config",
]
__version__ = "0.1.0"
