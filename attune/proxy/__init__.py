"""The `proxy` stack: real tiny training on the CPU that reproduces a recipe's numerics-relevant parts
(batching and accumulation, reduction order and dtype, schedule, recomputation, float8, MoE routing),
so the correctness gate gets real loss curves without a GPU.

    proxy_config(recipe, steps, seed, noise_seed) -> ProxyConfig
    run(config) -> ProxyRun   (curve rows + step-1 probe record)
"""

from attune.proxy.config import ProxyConfig, proxy_config
from attune.proxy.train import ProxyRun, run

__all__ = ["ProxyConfig", "ProxyRun", "proxy_config", "run"]
