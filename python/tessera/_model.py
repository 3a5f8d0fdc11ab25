"""tessera.load: a trained model, its logits, generation and weights."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from . import _tessera

PathLike = Union[str, "os.PathLike[str]"]


class Model:
    """A GPT loaded from weights (``model.safetensors`` and ``config.json``, as ``tessera train
    --save`` or Hugging Face write them) with its tokenizer when one lies beside them.

    Its computations run in this process with the GIL released.
    """

    def __init__(self, impl: Any) -> None:
        self._m = impl

    @property
    def config(self) -> Dict[str, Any]:
        """The model's configuration, as a Hugging Face ``config.json``."""
        return self._m.config

    @property
    def vocab_size(self) -> int:
        return self._m.vocab_size

    @property
    def block_size(self) -> int:
        """The longest sequence :meth:`forward` takes (the model's context)."""
        return self._m.block_size

    def forward(self, tokens: Any) -> np.ndarray:
        """The logits ``[B, T, vocab_size]`` (float32) of token ids ``[B, T]`` or ``[T]`` (then
        ``[T, vocab_size]``), without dropout.

        Raises:
            ShapeError: more sequences than ``max_batch``, a sequence longer than the context, or
                an id outside the vocabulary.
        """
        t = np.asarray(tokens)
        if not np.issubdtype(t.dtype, np.integer):
            raise TypeError(f"token ids must be integers, not {t.dtype}")
        one = t.ndim == 1
        t = np.ascontiguousarray(t.reshape(1, -1) if one else t, dtype=np.int32)
        out = self._m.forward(t)
        return out[0] if one else out

    __call__ = forward

    def encode(self, text: str) -> List[int]:
        """Token ids of ``text`` (special tokens such as ``<|endoftext|>`` recognised)."""
        return self._m.encode(text)

    def decode(self, ids: Sequence[int], errors: str = "replace") -> str:
        """The text of token ids (bytes that are not UTF-8 handled by ``errors``, as in
        ``bytes.decode``)."""
        return self._m.decode([int(i) for i in ids]).decode("utf-8", errors)

    def generate(self, prompt: Union[str, Sequence[int]], max_new_tokens: int = 200, *,
                 temperature: float = 0.8, top_k: int = 40, seed: int = 0) -> Union[str, List[int]]:
        """Samples ``max_new_tokens`` tokens after ``prompt`` (``tessera sample``'s sampler: the
        same seed gives the same tokens). A text prompt returns the new text, token ids return
        the new ids."""
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        out = self._m.generate_ids(ids, int(max_new_tokens), float(temperature), int(top_k),
                                   int(seed))
        return self.decode(out) if isinstance(prompt, str) else out

    def weights(self) -> Dict[str, np.ndarray]:
        """Every parameter under its Hugging Face name (``h.0.attn.c_attn.weight``, ...) as a
        read-only float32 numpy view of the model's memory: no copy, and the model stays alive
        while a view does."""
        return self._m.weights()

    def __repr__(self) -> str:
        c = self.config
        return (f"<tessera.Model {c.get('n_layer')} layers, width {c.get('n_embd')}, "
                f"vocab {self.vocab_size}, context {self.block_size}>")


def load(path: PathLike, *, tokenizer: Optional[PathLike] = None, max_batch: int = 8,
         heads: int = 0) -> Model:
    """Loads a model for inference.

    Args:
        path: a ``model.safetensors`` file or a directory holding one (a ``tessera train --save``
            directory: its exported weights), with ``config.json`` beside it.
        tokenizer: a tokenizer file (tokenizer.json, tokenizer.model, tessera's BPE); None: the
            one beside the weights, if any.
        max_batch: the most sequences one :meth:`Model.forward` takes.
        heads: attention heads when no config.json gives them (0: from config.json).

    Raises:
        ConfigError, IoError: missing or inconsistent files (the library's messages).
    """
    return Model(_tessera._load(os.fspath(path), os.fspath(tokenizer) if tokenizer else "",
                                int(max_batch), int(heads)))
