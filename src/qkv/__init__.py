"""qkv — transformer encoders built around self-attention."""

__version__ = "0.1.0"

__all__ = ["__version__", "load", "Pretrained", "save", "export_hf", "convert", "ModelConfig", "build_encoder",
           "build_masked_lm", "build_causal_lm", "embed", "TaskConfig", "SequenceClassifier", "TokenClassifier",
           "attach_task_head", "pipeline"]

# The user-facing facade: these names are imported on first use (importlib, below), so that ``import qkv``
# stays light — torch alone takes 1.2 s to import. Inside qkv every name is imported from the module
# that defines it (the value of each entry).
_LAZY = {
    "load": "qkv.checkpoints.io",
    "Pretrained": "qkv.checkpoints.io",
    "save": "qkv.checkpoints.io",
    "export_hf": "qkv.checkpoints.io",
    "convert": "qkv.checkpoints.convert",
    "ModelConfig": "qkv.config",
    "build_encoder": "qkv.models.builders",
    "build_masked_lm": "qkv.models.builders",
    "build_causal_lm": "qkv.models.builders",
    "embed": "qkv.embeddings.embedder",
    "TaskConfig": "qkv.models.heads",
    "SequenceClassifier": "qkv.models.task_models",
    "TokenClassifier": "qkv.models.task_models",
    "attach_task_head": "qkv.models.task_builders",
    "pipeline": "qkv.pipelines.factory",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'qkv' has no attribute {name!r}")
