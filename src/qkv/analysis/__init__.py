"""Understanding a model: every layer's outputs, every head's attention, and how layers differ.

Python API (all results are dataclasses holding NumPy arrays):

* :func:`analyze` / :func:`run_analyze` — layer statistics (:class:`LayerStats`) and head statistics
  (:class:`HeadStats`) over a corpus, and the report folder (``qkv analyze``);
* :func:`inspect_text` / :func:`run_inspect` — one text's attention maps, PNG heatmaps and the
  offline HTML viewer (``qkv inspect``);
* the building blocks: :func:`iter_captures` (batched capture), :func:`anisotropy`,
  :func:`self_similarity`, :func:`intra_similarity`, :func:`linear_cka`, :func:`linear_probe`,
  :func:`head_statistics`.

See docs/analysis.md.

Import each name from the module that defines it."""
