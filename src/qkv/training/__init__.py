"""Masked-LM pretraining: config, the explicit loop, optimiser/schedule, checkpoints, distributed.

Import each name from the module that defines it."""
