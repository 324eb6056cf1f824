"""Models built from a :class:`~qkv.config.ModelConfig`: the builders (the only readers of a config),
the masked-LM, causal-LM and encoder–decoder models, task heads, ELECTRA's discriminator, the kinds of
model. Checkpoint formats are in :mod:`qkv.checkpoints`. Import each name from its module."""
