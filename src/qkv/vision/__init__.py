"""Self-attention on images: image classification on the training engine, augmentation, attention
over a picture (rollout, mean attention distance). See docs/vision.md.

Modules: :mod:`~qkv.vision.config` (the run configuration and the recipes), :mod:`~qkv.vision.augment`,
:mod:`~qkv.vision.classify` (the classification objective and run), :mod:`~qkv.vision.attention_maps`
(attention over the image, rollout, mean attention distance), :mod:`~qkv.vision.pretrain_options`.

Import each name from the module that defines it."""
