"""fairkv: reproduction of "The Pitfalls of KV Cache Compression" (arXiv 2510.00231).

Modules: ``models`` (load the embedded or any HF model), ``data`` (sys_ifeval, RaccoonBench), ``prompts`` (the paper's
system prompt with token spans), ``presses`` (the five kvpress policies and the kept-index recorder), ``generation``
(compress the system prompt once, answer each query greedily), ``metrics`` (IFEval, ROUGE-L leakage, keep rates),
``evaluate`` (one prompt through every policy and ratio), ``figures``.
"""

__version__ = "0.1.0"
