"""The Python API: ``LLM`` and ``SamplingParams`` (vLLM's names), wrapping ``run/``'s pipeline.

``from specdec_cli import LLM, SamplingParams`` resolves here (lazily, so the CLI loads no torch for it).
"""
from specdec_cli.api.llm import LLM
from specdec_cli.api.outputs import RequestMetrics, RequestOutput
from specdec_cli.api.params import SamplingParams
from specdec_cli.errors import ConfigError

__all__ = ["LLM", "SamplingParams", "RequestOutput", "RequestMetrics", "ConfigError"]
