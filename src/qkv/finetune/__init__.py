"""Fine-tuning: task heads trained on labelled data by the shared training engine, evaluated against
baselines on the same split, and used for prediction (``qkv finetune``, ``qkv predict``)."""

from qkv.finetune.config import BASELINES, TASKS, FinetuneConfig
from qkv.finetune.examples import Examples, FinetuneDataError, read_examples
from qkv.finetune.run import FinetuneResult, finetune

__all__ = ["BASELINES", "TASKS", "FinetuneConfig", "Examples", "FinetuneDataError", "read_examples",
           "FinetuneResult", "finetune", "predict_file"]


def __getattr__(name: str):
    if name == "predict_file":
        from qkv.finetune.predict import predict_file

        return predict_file
    raise AttributeError(f"module 'qkv.finetune' has no attribute {name!r}")
