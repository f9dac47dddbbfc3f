"""Specifications of what is trained (model), where (cluster) and with what (stack)."""

from attune.spec.cluster import Accelerator, ClusterSpec, accelerator, parse_cluster_flag
from attune.spec.model import ModelSpec, catalog_model, load_model_spec, model_names
from attune.spec.stack import StackSpec

__all__ = [
    "Accelerator", "ClusterSpec", "accelerator", "parse_cluster_flag",
    "ModelSpec", "catalog_model", "load_model_spec", "model_names", "StackSpec",
]
