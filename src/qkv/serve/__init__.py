"""``qkv serve``: models over HTTP — OpenAI-compatible embeddings and completions, classification,
fill-mask, dynamic batching, Prometheus metrics and the attention explorer (see docs/serving.md).

Modules: :mod:`~qkv.serve.config` (:class:`ServeConfig`), :mod:`~qkv.serve.registry` (the models
by name, their operations and queues), :mod:`~qkv.serve.operations`,
:mod:`~qkv.serve.completions` and :mod:`~qkv.serve.explorer` (what a batch runs),
:mod:`~qkv.serve.batching` (the queue and its thread), :mod:`~qkv.serve.bodies` (request checks),
:mod:`~qkv.serve.api` and :mod:`~qkv.serve.pages` (the routes), :mod:`~qkv.serve.security`,
:mod:`~qkv.serve.metrics`, :mod:`~qkv.serve.app` (the ASGI application),
:mod:`~qkv.serve.runner` (:func:`serve`, :class:`BackgroundServer`), :mod:`~qkv.serve.cli`.

Import each name from the module that defines it."""
