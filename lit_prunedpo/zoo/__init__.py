"""A tiny, randomly initialised float32 model for every decoder-only text architecture transformers knows.

For the conformance tests and the generated supported-models table. :func:`causal_lm_types` lists every
``model_type`` of transformers' causal-LM auto mapping; :func:`tiny_config` shrinks a type's default config (no hub
access: configs come from the config classes) to a model of about 100k parameters; :func:`build_tiny` builds it and
checks it; :func:`zoo` sorts every type into buildable and :class:`Unbuildable` (with a one-line reason).

The modules: :mod:`~lit_prunedpo.zoo.catalogue` (the types transformers knows, and which are no decoder-only text
model), :mod:`~lit_prunedpo.zoo.shrink_values` (what shrinking sets, by field name, and :data:`OVERRIDES`),
:mod:`~lit_prunedpo.zoo.shrink` (:func:`tiny_config`), :mod:`~lit_prunedpo.zoo.build` (:func:`build_tiny`,
:func:`zoo`).

How a config is shrunk (:func:`tiny_config`):

1. **Generically**, for every size field the config class has (under its own name or through its
   ``attribute_map``): ``hidden_size`` 64, 2 layers, 4 attention heads, 2 key/value heads, ``head_dim`` 16,
   ``intermediate_size`` 128, expert sizes 64, 4 experts with top-2 routing, the vocabulary (special token ids
   wrapped into it), ``max_position_embeddings`` 256, small Mamba/conv/linear-attention sizes. Per-layer lists
   (``layer_types``, ``mlp_layer_types``, ...) keep one layer of each kind the default config has, so a hybrid's
   layers hold both kinds (a linear-attention/Mamba/conv layer and an attention layer; a sliding and a full one).
   Text sub-configs of a composite config are shrunk the same way; image/audio sub-configs are left alone.
2. **Sliding windows** are switched on with a window of ``sliding_window`` tokens (8: shorter than the test
   sequences, so it bites) wherever the architecture has one.
3. **Head transforms and multipliers** whose default is a no-op (Granite's ``logits_scaling`` and multipliers,
   Falcon-H1's ``lm_head_multiplier``, an unset soft-cap or ``logit_scale``), where the modeling code reads them,
   get a value that changes the log-probs, so that a scorer ignoring them fails the conformance tests. Non-trivial
   defaults (Gemma 2's soft-cap of 30, Cohere's ``logit_scale``) are kept.
4. Architectures whose default is bidirectional but which have a causal mode get it (``is_decoder`` of the
   BERT-style stacks, XLM's ``causal``).
5. **Per-architecture overrides** (:data:`OVERRIDES`, one dict, by ``model_type``) come last.

Training-time noise (dropout, router jitter) is left as the config ships it: the framework has to disable it
itself. Nothing else that changes the numerics is touched.

A type is *buildable* (:func:`build_tiny`) when its model builds on CPU in float32 and, in eval mode, a forward of
``(2, 20)`` random tokens returns finite logits ``[2, 20, V]`` (``V >= vocab_size``), the same on a second forward,
with the first 15 positions unchanged when the last 5 tokens change (causal). Left out (:class:`Unbuildable`):
encoder-decoder models (and decoders with cross-attention to an encoder), causal-LM classes that take image or
audio inputs, speculative-decoding assistants, models over :data:`MAX_PARAMETERS` after shrinking, classes without
the requested ``attn_implementation`` (``None``, the default: transformers' own choice, ``sdpa`` where the class
has it and ``eager`` otherwise, as a user who names none gets), and whatever transformers fails to build or run, or that
fails a check.
"""

from lit_prunedpo.zoo.build import CHECK_SHAPE, MAX_PARAMETERS, build_tiny, zoo
from lit_prunedpo.zoo.catalogue import Unbuildable, UnbuildableError, causal_lm_types
from lit_prunedpo.zoo.shrink import tiny_config
from lit_prunedpo.zoo.shrink_values import OVERRIDES

__all__ = ["CHECK_SHAPE", "MAX_PARAMETERS", "OVERRIDES", "Unbuildable", "UnbuildableError", "build_tiny",
           "causal_lm_types", "tiny_config", "zoo"]
