"""Fine-tuning: task heads trained on labelled data by the shared training engine, evaluated against
baselines on the same split, and used for prediction (``qkv finetune``, ``qkv predict``).

Import each name from the module that defines it."""
