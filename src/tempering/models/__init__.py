"""Models: loading a folder, a ``.gguf`` file or a hub id (``loading``), the model cache
(``cache``), the device and its bf16 check (``device``), the built-in tiny architecture
(``tiny``), LoRA adapters (``lora``), attention for bf16 on a CPU (``attention``) and every use
of transformers beyond its public model API (``compat``).

Not here: what a config's ``model.path`` may name beyond a path (``builtin:*``, run folders:
``tempering.policy`` resolves them), pre-training (``tempering.pretrain``) and checkpoints
(``tempering.checkpoint``); nothing in this folder imports either.
"""
