"""Self-attention on images: image classification and image captioning on the training engine,
augmentation, attention over a picture (rollout, mean attention distance), captions with their
cross-attention, and the image side of the commands. See docs/vision.md.

Modules: :mod:`~qkv.vision.config` (the run configuration and the recipes), :mod:`~qkv.vision.augment`,
:mod:`~qkv.vision.classify` (the classification objective and run), :mod:`~qkv.vision.attention_maps`
(attention over the image, rollout, mean attention distance), :mod:`~qkv.vision.pretrain_options`;
captioning: :mod:`~qkv.vision.caption_config` (its run configuration and recipes),
:mod:`~qkv.vision.captioning` (the objective and run), :mod:`~qkv.vision.caption` (greedy captions and
each written word's cross-attention), :mod:`~qkv.vision.caption_scores` (exact match, BLEU, baselines,
attention in cell), :mod:`~qkv.vision.cli` (``qkv caption``);
for the commands: :mod:`~qkv.vision.pictures` (image-model folders, pictures read as the model reads
them), :mod:`~qkv.vision.predict` (``qkv predict``), :mod:`~qkv.vision.inspect_image` and
:mod:`~qkv.vision.figures` (``qkv inspect``), :mod:`~qkv.vision.analyze_image` (``qkv analyze``).

Import each name from the module that defines it."""
